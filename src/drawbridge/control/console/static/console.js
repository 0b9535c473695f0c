// drawbridge console: progressive enhancement only; every form works without this script.
"use strict";

// A row's action is applied only when its Apply button is pressed (or Enter on it): moving through
// the selector's options by keyboard changes nothing. The row is then fetched again for the agent its
// form sets (never the page's own URL, whose default agent may since have changed) and for that tool
// alone (whatever the filters), so it shows the value in force and the decision, refused or not.

function submitInline(form) {
  const out = form.querySelector("output");
  const body = new FormData(form);
  const table = form.closest("table[data-agent]");
  if (table) { body.set("shown_agent", table.getAttribute("data-agent")); }  // the agent the page names
  out.textContent = "saving…";
  fetch(form.getAttribute("action"), {
    method: "POST", body: body, credentials: "same-origin",
    headers: { "Accept": "application/json" },
  }).then((response) => response.json().then((answer) => {
    out.textContent = answer.message || answer.error || String(response.status);
    out.className = "row-result " + (response.ok ? "ok" : "refused");
    refreshRow(form.closest("tr"), form);
  })).catch(() => { out.textContent = "the gateway did not answer"; out.className = "row-result refused"; });
}

function refreshRow(row, form) {
  if (!row) { return; }
  const agent = form.querySelector("input[name=agent]").value;
  const name = row.getAttribute("data-tool");
  const url = "/console/tools?" + new URLSearchParams({ agent: agent, tool: name }).toString();
  fetch(url, { credentials: "same-origin" }).then((r) => r.text()).then((html) => {
    const doc = new DOMParser().parseFromString(html, "text/html");
    const fresh = Array.from(doc.querySelectorAll("tr[data-tool]")).find((tr) => tr.getAttribute("data-tool") === name);
    const freshForm = fresh && fresh.querySelector("form[data-inline]");
    if (!fresh || !freshForm || freshForm.querySelector("input[name=agent]").value !== agent) { return; }
    const focused = row.contains(document.activeElement) ? document.activeElement.getAttribute("name") : null;
    const message = row.querySelector("output");
    fresh.querySelector("output").replaceWith(message);
    const shown = document.importNode(fresh, true);
    row.replaceWith(shown);
    bindInline(shown);
    if (focused) {
      const again = shown.querySelector(`[name="${focused}"]`);
      if (again) { again.focus(); }
    }
  });
}

function bindInline(root) {
  root.querySelectorAll("form[data-inline]").forEach((form) => {
    form.addEventListener("submit", (event) => { event.preventDefault(); submitInline(form); });
  });
}

// The pending approvals. A card on the page never moves or changes under the operator's pointer:
// an approval that arrives is announced in the news line (which keeps its place) and shown only when
// the operator asks; one that ended elsewhere stays where it is, its buttons disabled and labelled.
// Reasons typed into the cards are kept when the operator shows the new list.

function cardsOf(box) { return Array.from(box.querySelectorAll("article[data-approval]")); }

function idsOf(box) { return new Set((box.getAttribute("data-ids") || "").split(" ").filter((id) => id)); }

function fetchPending(box) {
  return fetch(box.getAttribute("data-poll"), { credentials: "same-origin" }).then((r) => r.ok ? r.text() : null).then((html) => {
    if (html === null) { return null; }
    return new DOMParser().parseFromString(html, "text/html").getElementById("pending");
  });
}

function showPending(fresh) {
  const current = document.getElementById("pending");
  const typed = new Map(cardsOf(current).map((card) => [card.getAttribute("data-approval"), card.querySelector("input[name=reason]")]));
  const shown = document.importNode(fresh, true);
  cardsOf(shown).forEach((card) => {
    const before = typed.get(card.getAttribute("data-approval"));
    const input = card.querySelector("input[name=reason]");
    if (before && input) { input.value = before.value; }
  });
  current.replaceWith(shown);
}

function markEnded(card) {
  if (card.hasAttribute("data-ended")) { return; }
  card.setAttribute("data-ended", "");
  card.querySelectorAll("form.resolve button").forEach((button) => { button.disabled = true; });
  const state = card.querySelector("[data-state]");
  if (state) { state.textContent = "No longer pending (decided elsewhere, or timed out): these buttons no longer act."; }
  const badge = card.querySelector(".badge");
  if (badge) { badge.textContent = "ended"; }
}

function announce(box, arrived) {
  const news = box.querySelector("[data-news]");
  if (!news) { return; }
  const said = news.getAttribute("data-arrived") || "0";
  if (said === String(arrived)) { return; }
  news.setAttribute("data-arrived", String(arrived));
  news.replaceChildren();
  if (arrived === 0) { return; }
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = arrived === 1 ? "1 new approval: show it" : `${arrived} new approvals: show them`;
  button.addEventListener("click", () => fetchPending(box).then((fresh) => { if (fresh) { showPending(fresh); } }));
  news.append(button);
}

function pollPending() {
  if (!document.getElementById("pending")) { return; }
  window.setInterval(() => {
    const box = document.getElementById("pending");
    fetchPending(box).then((fresh) => {
      if (!fresh || box !== document.getElementById("pending")) { return; }
      const shown = cardsOf(box);
      if (shown.length === 0) {  // no card an operator could be aiming at: show the list as it is
        if (cardsOf(fresh).length > 0) { showPending(fresh); }
        return;
      }
      const pending = idsOf(fresh);
      const known = idsOf(box);
      shown.forEach((card) => { if (!pending.has(card.getAttribute("data-approval"))) { markEnded(card); } });
      announce(box, Array.from(pending).filter((id) => !known.has(id)).length);
    });
  }, 2000);
}

// "expires in N s" counts down between polls: each count is read against the time its card was
// rendered (the server's figure then), and keeps the width it was first shown with, so a count that
// loses a digit never reflows the card and moves its buttons.

function countDown() {
  const now = Date.now();
  document.querySelectorAll("[data-remaining]").forEach((span) => {
    if (!span.hasAttribute("data-deadline")) {
      const seconds = Number(span.getAttribute("data-remaining"));
      if (!Number.isFinite(seconds)) { return; }
      span.setAttribute("data-deadline", String(now + seconds * 1000));
      span.style.minWidth = `${span.getBoundingClientRect().width}px`;
    }
    const left = Math.max(0, Math.ceil((Number(span.getAttribute("data-deadline")) - now) / 1000));
    if (span.textContent !== String(left)) { span.textContent = String(left); }
  });
}

function startCountDown() {
  countDown();
  window.setInterval(countDown, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("form[data-autosubmit] select, form[data-autosubmit] input[type=checkbox]").forEach((control) => {
    control.addEventListener("change", () => control.form.submit());
  });
  bindInline(document);
  pollPending();
  startCountDown();
});
