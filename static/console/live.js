/* Live refresh of console pages, over htmx (loaded before this file by base.html).
 *
 * A polled element carries data-live-poll and hx-trigger="every 5s": each poll is let through (the
 * htmx:confirm listener below) only while the tab is visible, the operator has not paused it, and
 * nothing the operator is handling sits inside it (a ticked checkbox, the keyboard focus). The
 * condition lives here, not in the trigger: htmx evaluates trigger filters as code, which the
 * Content-Security-Policy (no eval, no inline script) forbids. The indicator
 * (templates/console/live_indicator.html) is hidden in the HTML and shown here, so a page
 * without JavaScript shows no promise it cannot keep.
 */
(function () {
  "use strict";
  var PAUSED = "data-live-paused";

  window.consoleLive = function (elt) {
    if (document.visibilityState !== "visible") return false;
    if (document.documentElement.hasAttribute(PAUSED)) return false;
    if (elt.querySelector("input[type='checkbox']:checked")) return false;
    if (elt.contains(document.activeElement) && document.activeElement !== document.body) return false;
    return true;
  };

  document.addEventListener("htmx:confirm", function (event) {
    var elt = event.detail.elt;
    if (elt && elt.hasAttribute && elt.hasAttribute("data-live-poll") && !window.consoleLive(elt)) {
      event.preventDefault();
    }
  });

  function indicators() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-live]"));
  }

  function show(text, stopped) {
    indicators().forEach(function (box) {
      var paused = document.documentElement.hasAttribute(PAUSED);
      box.querySelector("[data-live-state]").textContent = text || (paused ? "Paused" : "Live");
      box.classList.toggle("live-paused", paused || !!stopped);
      var toggle = box.querySelector("[data-live-toggle]");
      toggle.setAttribute("aria-pressed", paused ? "true" : "false");
      toggle.textContent = paused ? "Resume" : "Pause";
      toggle.hidden = !!stopped;
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!window.htmx || !document.querySelector("[data-live-poll]")) return;
    indicators().forEach(function (box) { box.hidden = false; });
    show();
  });

  document.addEventListener("click", function (event) {
    var toggle = event.target.closest && event.target.closest("[data-live-toggle]");
    if (!toggle) return;
    document.documentElement.toggleAttribute(PAUSED);
    show();
  });

  document.addEventListener("htmx:afterSettle", function () {
    if (!document.querySelector("[data-live-poll]")) {
      show("Finished: nothing more will change", true);
      return;
    }
    show();
    var stamp = new Date().toLocaleTimeString();
    indicators().forEach(function (box) {
      box.querySelector("[data-live-updated]").textContent = " (updated " + stamp + ")";
    });
  });

  function failed() { show("Not updating: the last refresh failed (retrying)"); }
  document.addEventListener("htmx:responseError", failed);
  document.addEventListener("htmx:sendError", failed);
})();
