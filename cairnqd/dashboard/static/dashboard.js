// The cairnqd dashboard's only script (no inline script: the CSP forbids it).
// 1. A form with data-confirm asks before it posts.
// 2. A page whose <main id="page"> has data-live="MS" re-reads itself every MS
//    milliseconds and swaps its main part in, without reloading. It pauses while the
//    tab is hidden or while the operator types in a field of the page. A <details> the
//    operator opened (one with an id) stays open across the swap.
(function () {
  "use strict";

  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  var page = document.getElementById("page");
  if (!page || !page.dataset.live) {
    return;
  }
  var every = Math.max(250, parseInt(page.dataset.live, 10) || 2000);
  var state = document.getElementById("live-state");

  function say(text) {
    if (state) {
      state.textContent = text;
    }
  }

  function typing() {
    var active = document.activeElement;
    return Boolean(active && page.contains(active) &&
      /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName) && active.value);
  }

  function tick() {
    if (document.hidden || typing()) {
      window.setTimeout(tick, every);
      return;
    }
    window.fetch(window.location.href, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { "X-Requested-With": "cairnqd-live" }
    }).then(function (response) {
      if (response.redirected) {
        throw new Error("log in again");
      }
      if (!response.ok) {
        throw new Error("the server answered " + response.status);
      }
      return response.text();
    }).then(function (text) {
      var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("page");
      if (!fresh) {
        throw new Error("the answer was not a dashboard page");
      }
      var opened = Array.prototype.map.call(
        page.querySelectorAll("details[open][id]"), function (d) { return d.id; });
      page.innerHTML = fresh.innerHTML;
      opened.forEach(function (id) {
        var again = document.getElementById(id);
        if (again && again.tagName === "DETAILS") {
          again.open = true;
        }
      });
      page.dataset.updated = String(Date.now());
      if (!fresh.dataset.live) {
        delete page.dataset.live;
        say("final: updates stopped");
        return;
      }
      say("live, updated " + new Date().toLocaleTimeString());
      window.setTimeout(tick, every);
    }).catch(function (error) {
      say("not updating: " + error.message + "; retrying");
      window.setTimeout(tick, every * 2);
    });
  }

  window.setTimeout(tick, every);
}());
