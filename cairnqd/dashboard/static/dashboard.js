// The cairnqd dashboard's only script (no inline script: the CSP forbids it).
// 1. A form, or the button that submits it, with data-confirm asks before it posts.
// 2. The task list's checkboxes: "select all" and how many are ticked.
// 3. A page whose <main id="page"> has data-live="MS" re-reads itself every MS
//    milliseconds and swaps its main part in, without reloading. It waits while the
//    tab is hidden, while the operator types in a field of the page, has text of it
//    selected or holds a mouse button down on it, and while paused by the footer's
//    button (an answer that arrives meanwhile is dropped, not swapped in); the
//    footer's interval choice is remembered in this browser. Ticked checkboxes stay
//    ticked across a swap, and a <details> the operator opened (one with an id)
//    stays open.
(function () {
  "use strict";

  var EVERY_KEY = "cairnqd-live-every";

  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    var question = (button && button.getAttribute("data-confirm")) ||
      event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  function picked() {
    var boxes = document.querySelectorAll("form.selection input[type=checkbox][name=id]");
    var ticked = 0;
    boxes.forEach(function (box) {
      if (box.checked) {
        ticked += 1;
      }
    });
    var note = document.getElementById("picked");
    if (note) {
      note.textContent = ticked ? ticked + " selected" : "";
    }
    var all = document.getElementById("pick-all");
    if (all) {
      all.checked = boxes.length > 0 && ticked === boxes.length;
    }
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target.id === "pick-all") {
      document.querySelectorAll("form.selection input[type=checkbox][name=id]")
        .forEach(function (box) {
          box.checked = target.checked;
        });
    }
    if (target.type === "checkbox") {
      picked();
    }
  });

  var page = document.getElementById("page");
  if (!page || !page.dataset.live) {
    return;
  }
  var every = Math.max(250, parseInt(page.dataset.live, 10) || 2000);
  var state = document.getElementById("live-state");
  var pauseButton = document.getElementById("live-pause");
  var choice = document.getElementById("live-every");
  var paused = false;
  var timer = null;

  function say(text) {
    if (state) {
      state.textContent = text;
    }
  }

  try {
    var remembered = parseInt(window.localStorage.getItem(EVERY_KEY), 10);
    if (remembered >= 250 && choice &&
        choice.querySelector("option[value='" + remembered + "']")) {
      choice.value = String(remembered);
      every = remembered;
    }
  } catch (ignored) {
    // Storage refused (a private window): the page's own interval stands.
  }

  function typing() {
    var active = document.activeElement;
    return Boolean(active && page.contains(active) &&
      /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName) && active.value);
  }

  function selecting() {
    var selection = window.getSelection();
    return Boolean(selection && !selection.isCollapsed && selection.rangeCount &&
      page.contains(selection.getRangeAt(0).commonAncestorContainer));
  }

  // A mouse button or a finger down on the page: swapping the page then replaces the
  // element it went down on, and the browser fires no click on the one it comes up on.
  var pressed = false;
  page.addEventListener("pointerdown", function () {
    pressed = true;
  });
  ["pointerup", "pointercancel"].forEach(function (kind) {
    window.addEventListener(kind, function () {
      // Cleared after this turn: the click the same release makes comes first.
      window.setTimeout(function () {
        pressed = false;
      }, 0);
    }, true);
  });
  window.addEventListener("blur", function () {
    pressed = false;
  });

  // Why the page must not be swapped now ("" when it may be).
  function holding() {
    if (typing()) {
      return "a field is being filled in";
    }
    if (selecting()) {
      return "text is selected";
    }
    if (pressed) {
      return "a mouse button is held down";
    }
    return "";
  }

  function ticked() {
    var kept = [];
    page.querySelectorAll("input[type=checkbox]").forEach(function (box) {
      if (box.checked) {
        kept.push([box.name, box.value, box.id]);
      }
    });
    return kept;
  }

  function retick(kept) {
    kept.forEach(function (one) {
      page.querySelectorAll("input[type=checkbox]").forEach(function (box) {
        if (box.name === one[0] && box.value === one[1] && box.id === one[2]) {
          box.checked = true;
        }
      });
    });
  }

  function later(ms) {
    window.clearTimeout(timer);
    timer = window.setTimeout(tick, ms);
  }

  function tick() {
    if (paused) {
      return;
    }
    var why = holding();
    if (document.hidden || why) {
      if (why) {
        say("waiting while " + why);
      }
      later(every);
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
      // Paused, or held (typing, selecting, pressing), while the answer was on its
      // way: keep the page as the operator has it.
      var still = holding();
      if (paused || still) {
        if (still) {
          say("waiting while " + still);
        }
        later(every);
        return;
      }
      var kept = ticked();
      var opened = Array.prototype.map.call(
        page.querySelectorAll("details[open][id]"), function (d) { return d.id; });
      page.innerHTML = fresh.innerHTML;
      retick(kept);
      opened.forEach(function (id) {
        var again = document.getElementById(id);
        if (again && again.tagName === "DETAILS") {
          again.open = true;
        }
      });
      page.dataset.updated = String(Date.now());
      if (!fresh.dataset.live) {
        delete page.dataset.live;
        if (pauseButton) {
          pauseButton.disabled = true;
        }
        say("final: updates stopped");
        return;
      }
      say("live, updated " + new Date().toLocaleTimeString());
      later(every);
    }).catch(function (error) {
      say("not updating: " + error.message + "; retrying");
      later(every * 2);
    });
  }

  if (pauseButton) {
    pauseButton.addEventListener("click", function () {
      paused = !paused;
      pauseButton.textContent = paused ? "Resume" : "Pause";
      pauseButton.setAttribute("aria-pressed", paused ? "true" : "false");
      if (paused) {
        window.clearTimeout(timer);
        say("paused");
      } else {
        say("live, every " + every / 1000 + "s");
        later(0);
      }
    });
  }
  if (choice) {
    choice.addEventListener("change", function () {
      every = Math.max(250, parseInt(choice.value, 10) || every);
      try {
        window.localStorage.setItem(EVERY_KEY, String(every));
      } catch (ignored) {
        // Not remembered; this page still uses it.
      }
      if (!paused) {
        say("live, every " + every / 1000 + "s");
        later(every);
      }
    });
  }

  later(every);
}());
