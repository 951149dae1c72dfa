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
  // A layout this engine refuses is listed (marked ⊘, with why) but neither a click nor Enter can pick it: the
  // dropdown keeps its value (issue 29's audit).
  const refused = (item) => item instanceof Element && item.matches('li[role="option"][aria-label^="⊘"]');
  // The option Enter will take, as Gradio's dropdown decides a tick after the key: the active one if the typed text
  // lists it, else the first option whose label holds the typed text (all are listed while the text is the chosen
  // option's own label). Judged here, before that handler runs, from the options in the page.
  const optionEnterWouldTake = (input) => {
    const list = input.getAttribute("aria-controls");
    if (!list) return null;
    const options = Array.from(document.querySelectorAll(`li[role="option"][id^="${CSS.escape(list)}-option-"]`));
    const label = (li) => li.getAttribute("aria-label") || "";
    const typed = input.value.toLowerCase();
    const chosen = options.find((li) => li.classList.contains("selected"));
    const listed = chosen && label(chosen) === input.value ? options
      : options.filter((li) => label(li).toLowerCase().includes(typed));
    const active = document.getElementById(input.getAttribute("aria-activedescendant") || "");
    return listed.includes(active) ? active : (listed[0] || null);
  };
  document.addEventListener("keydown", (event) => {
    const input = event.target;
    if (event.key !== "Enter" || !(input instanceof HTMLInputElement) || input.getAttribute("role") !== "combobox") {
      return;
    }
    if (refused(optionEnterWouldTake(input))) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);
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
