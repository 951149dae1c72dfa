() => {
  // Ctrl+Enter (Cmd+Enter on a Mac) in the Generate tab presses Generate, as in other studios.
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey)) return;
    const button = document.querySelector("#generate");
    if (button && button.offsetParent !== null && !button.disabled) {
      event.preventDefault();
      button.click();
    }
  });
}
