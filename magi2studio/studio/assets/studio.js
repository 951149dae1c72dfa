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
  // Gradio's dropdown blurs its input once a choice is taken with Enter, which left a keyboard user on the
  // page body (the next Tab started from the top). Give the focus back to the dropdown the choice was made in.
  document.addEventListener("keydown", (event) => {
    const input = event.target;
    if (event.key !== "Enter" || !(input instanceof HTMLInputElement) || input.getAttribute("role") !== "combobox") {
      return;
    }
    setTimeout(() => {
      if (!document.activeElement || document.activeElement === document.body) input.focus();
    }, 0);
  }, true);
  // A layout this engine refuses is listed (marked ⊘, with why) but a click cannot pick it: the dropdown keeps its
  // value (issue 29's audit). Taken with the keyboard, the refusal line under the control says why, as before.
  const refused = (item) => item instanceof Element && item.matches('li[role="option"][aria-label^="⊘"]');
  for (const type of ["mousedown", "click"]) {
    document.addEventListener(type, (event) => {
      const item = event.target instanceof Element ? event.target.closest('li[role="option"]') : null;
      if (refused(item)) {
        event.preventDefault();
        event.stopImmediatePropagation();
      }
    }, true);
  }
}
