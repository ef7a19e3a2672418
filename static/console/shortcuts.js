/* Keyboard shortcuts for the console's lists (the queue first of all), no dependencies.
 *
 *   /      focus the page's search or first filter field
 *   j / k  move the row focus down / up in the page's main table (table.grid)
 *   Enter  open the focused row (its first link)
 *   x      tick the focused row's checkbox, where rows have one (bulk selection)
 *
 * Keys typed into a field, or with Ctrl/Alt/Meta held, are left alone. Pages work
 * the same without this script: every row is a link, every filter a plain form.
 */
(function () {
  "use strict";

  function typing(target) {
    if (!target || !target.tagName) return false;
    var tag = target.tagName.toLowerCase();
    return tag === "input" || tag === "textarea" || tag === "select" || target.isContentEditable;
  }

  function searchField() {
    return document.querySelector(
      "[data-shortcut='search'], main input[type='search'], " +
      "main form.filters input:not([type='hidden']), main form.filters select"
    );
  }

  function rows() {
    var table = document.querySelector("main table.grid");
    if (!table) return [];
    return Array.prototype.filter.call(table.querySelectorAll("tbody tr"), function (row) {
      return row.querySelector("a[href]");
    });
  }

  function focusRow(list, index) {
    var row = list[Math.max(0, Math.min(index, list.length - 1))];
    list.forEach(function (r) { r.classList.remove("row-focus"); });
    // Rows are not tab stops (links inside them are); -1 lets the script focus them.
    if (!row.hasAttribute("tabindex")) row.setAttribute("tabindex", "-1");
    row.classList.add("row-focus");
    row.focus();
    row.scrollIntoView({ block: "nearest" });
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.altKey || event.metaKey || typing(event.target)) return;
    var list, current;
    if (event.key === "/") {
      var field = searchField();
      if (field) { event.preventDefault(); field.focus(); }
      return;
    }
    if (event.key !== "j" && event.key !== "k" && event.key !== "Enter" && event.key !== "x") return;
    list = rows();
    if (!list.length) return;
    current = list.indexOf(document.activeElement && document.activeElement.closest
      ? document.activeElement.closest("tr") : null);
    if (event.key === "j" || event.key === "k") {
      event.preventDefault();
      if (current === -1) focusRow(list, event.key === "j" ? 0 : list.length - 1);
      else focusRow(list, current + (event.key === "j" ? 1 : -1));
    } else if (current !== -1 && document.activeElement === list[current]) {
      // Enter or x on the row itself (on a link inside it the browser does its own thing).
      if (event.key === "Enter") {
        event.preventDefault();
        window.location.assign(list[current].querySelector("a[href]").href);
      } else {
        var box = list[current].querySelector("input[type='checkbox']");
        if (box) { event.preventDefault(); box.click(); }
      }
    }
  });
})();
