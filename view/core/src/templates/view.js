// Live pages: the server sends a run's event count as it grows; the page
// fetches itself again and swaps in its fresh <main>, keeping the scroll.
const live = document.body.dataset.live;
if (live) {
  let shown = document.body.dataset.events;
  let busy = false;
  new EventSource(live).onmessage = async (message) => {
    if (busy || message.data === shown) return;
    busy = true;
    try {
      const html = await (await fetch(location.href)).text();
      const page = new DOMParser().parseFromString(html, "text/html");
      document.querySelector("main").replaceWith(page.querySelector("main"));
      shown = page.body.dataset.events;
    } finally {
      busy = false;
    }
  };
}
