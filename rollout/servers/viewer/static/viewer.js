// Live pages: while a job or session runs, poll its progress (read-only JSON) and reload the page
// when it changes (every 2 s; 10 s for big jobs). Stops once the job or session has finished.
(function () {
  const url = document.body.dataset.liveUrl;
  if (!url) return;
  const badge = document.getElementById("live");
  if (badge) badge.hidden = false;
  let last = null;
  async function poll() {
    try {
      const r = await fetch(url, { cache: "no-store" });
      if (!r.ok) return;
      const text = await r.text();
      if (last !== null && text !== last) { location.reload(); return; }
      last = text;
    } catch (e) { /* the viewer restarted: try again at the next tick */ }
    setTimeout(poll, Number(document.body.dataset.liveEvery) || 2000);
  }
  poll();
})();
// Keys on a session page: j the next session of the list it was opened from, k the previous one.
(function () {
  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const t = e.target;
    if (t && (t.tagName === "INPUT" || t.tagName === "SELECT" || t.tagName === "TEXTAREA" || t.isContentEditable)) return;
    const link = document.getElementById(e.key === "j" ? "next-session" : e.key === "k" ? "prev-session" : "");
    if (link) link.click();
  });
})();
