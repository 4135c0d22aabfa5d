// The staff dashboard refreshes its figures in place: it asks the page again for its figures
// fragment (drawn on the server, charts included) and swaps it in, with no reload and no state.
(function () {
  "use strict";
  const box = document.getElementById("rl-dashboard");
  const status = document.getElementById("rl-dashboard-status");
  if (!box) return;
  const every = 1000 * Number(box.dataset.refreshSeconds || 5);
  let timer = null;
  let busy = false;

  function say(text, trouble) {
    status.textContent = text;
    status.classList.toggle("rl-stale", Boolean(trouble));
  }

  async function refresh() {
    timer = null;
    if (document.hidden || busy) return;  // visibilitychange brings it back
    busy = true;
    try {
      await load();
    } finally {
      busy = false;
    }
  }

  async function load() {
    let response;
    try {
      response = await fetch(box.dataset.figuresUrl, { credentials: "same-origin", cache: "no-store", redirect: "manual" });
    } catch (err) {
      say("cannot reach the server; retrying", true);
      schedule();
      return;
    }
    // Signed out (a redirect to the login page) or no longer allowed: stop asking.
    if (response.type === "opaqueredirect" || response.status === 401 || response.status === 403) {
      say("not signed in as staff any more: reload the page", true);
      return;
    }
    if (!response.ok) {
      say("the server answered " + response.status + "; retrying", true);
      schedule();
      return;
    }
    const html = await response.text();
    const fresh = document.createRange().createContextualFragment(html);
    box.replaceChildren(fresh);
    const figures = box.querySelector(".rl-figures");
    say("as of " + (figures ? figures.dataset.asOf.replace("T", " ").slice(0, 19) + " UTC" : "now"), false);
    box.dispatchEvent(new CustomEvent("rl-refreshed", { bubbles: true }));
    schedule();
  }

  function schedule() {
    if (timer === null) timer = setTimeout(refresh, every);
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && timer === null) refresh();
  });
  schedule();
})();
