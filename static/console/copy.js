/* Copy buttons: a <button class="copy" data-copy="ID" hidden> copies the text of the element ID.
 *
 * Progressive: the buttons are hidden in the HTML and shown here (where the clipboard can be used),
 * so without JavaScript each value stays selectable text and no button promises what it cannot do.
 * Listening on the document covers buttons the live refresh swaps in later.
 */
(function () {
  "use strict";
  var SELECTOR = "button.copy[data-copy]";

  function reveal() {
    if (!navigator.clipboard) return;
    document.querySelectorAll(SELECTOR).forEach(function (button) { button.hidden = false; });
  }

  document.addEventListener("DOMContentLoaded", reveal);
  document.addEventListener("htmx:load", reveal);

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest(SELECTOR);
    var source = button && document.getElementById(button.dataset.copy);
    if (!source || !navigator.clipboard) return;
    navigator.clipboard.writeText(source.textContent).then(function () { button.textContent = "Copied"; });
  });
})();
