// The "unfold" button opens (or closes) every folded condition line on the page.
// Copy buttons: copy the text of the element named by data-copy; where the clipboard
// is unavailable (some file:// contexts), select the text so it can be copied by hand.
"use strict";
document.addEventListener("click", (event) => {
  const button = event.target.closest("button.copy");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  const select = () => {
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    button.textContent = "Selected";
  };
  if (!navigator.clipboard) return select();
  navigator.clipboard.writeText(source.textContent).then(() => {
    button.textContent = "Copied";
  }, select);
});

document.addEventListener("click", (event) => {
  const button = event.target.closest("button.expand");
  if (!button) return;
  const open = button.getAttribute("aria-pressed") !== "true";
  for (const details of document.querySelectorAll("aside.conditions details")) {
    details.open = open;
  }
  button.setAttribute("aria-pressed", String(open));
  button.textContent = open ? "Fold conditions" : "Unfold every condition";
});
