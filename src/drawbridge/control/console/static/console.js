// drawbridge console: progressive enhancement only; every form works without this script.
"use strict";

function submitInline(form) {
  const out = form.querySelector("output");
  out.textContent = "saving…";
  fetch(form.getAttribute("action"), {
    method: "POST", body: new FormData(form), credentials: "same-origin",
    headers: { "Accept": "application/json" },
  }).then((response) => response.json().then((answer) => {
    out.textContent = answer.message || answer.error || String(response.status);
    out.className = "row-result " + (response.ok ? "ok" : "refused");
    if (response.ok) { refreshRow(form.closest("tr")); }
  })).catch(() => { out.textContent = "the gateway did not answer"; out.className = "row-result refused"; });
}

function refreshRow(row) {
  if (!row) { return; }
  fetch(window.location.href, { credentials: "same-origin" }).then((r) => r.text()).then((html) => {
    const doc = new DOMParser().parseFromString(html, "text/html");
    const name = row.getAttribute("data-tool");
    const fresh = Array.from(doc.querySelectorAll("tr[data-tool]")).find((tr) => tr.getAttribute("data-tool") === name);
    if (!fresh) { return; }
    const message = row.querySelector("output");
    fresh.querySelector("output").replaceWith(message);
    row.replaceWith(fresh);
    bindInline(fresh);
  });
}

function bindInline(root) {
  root.querySelectorAll("form[data-inline]").forEach((form) => {
    form.addEventListener("submit", (event) => { event.preventDefault(); submitInline(form); });
    form.querySelectorAll("select").forEach((select) => select.addEventListener("change", () => submitInline(form)));
  });
}

function pollPending() {
  const box = document.getElementById("pending");
  if (!box) { return; }
  window.setInterval(() => {
    fetch(box.getAttribute("data-poll"), { credentials: "same-origin" }).then((r) => r.ok ? r.text() : null).then((html) => {
      if (html === null) { return; }
      const doc = new DOMParser().parseFromString(html, "text/html");
      const fresh = doc.getElementById("pending");
      const current = document.getElementById("pending");
      if (!fresh || !current || fresh.getAttribute("data-ids") === current.getAttribute("data-ids")) { return; }
      current.replaceWith(document.importNode(fresh, true));
    });
  }, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("form[data-autosubmit] select, form[data-autosubmit] input[type=checkbox]").forEach((control) => {
    control.addEventListener("change", () => control.form.submit());
  });
  bindInline(document);
  pollPending();
});
