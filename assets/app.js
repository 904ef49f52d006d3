// Browser-side behaviour of the pages that the server need not know about (issue 14):
// following the chat like a chat app, code block toolbars, files dropped or pasted, and Esc.
// Nothing here changes what the server sends; it only scrolls, decorates and emits `app-escape`.
(() => {
  "use strict";
  const NEAR_BOTTOM_PX = 80;

  // -- the chat follows the newest message while the reader is at the bottom -------------------
  let following = true;
  let observed = null;
  let observer = null;
  let observedPanel = null;
  let panelObserver = null;

  const scroller = () => document.scrollingElement || document.documentElement;
  const atBottom = () => {
    const s = scroller();
    return s.scrollHeight - (window.scrollY + window.innerHeight) <= NEAR_BOTTOM_PX;
  };
  const setFollowing = (value) => {
    following = value;
    document.body.classList.toggle("chat-scrolled-up", !value);
  };
  // A new chat shows its welcome from the top (issue 40: on a phone it opened 83 px down, its
  // heading under the top bar); once there are messages, the end is where the chat is.
  const hasMessages = () => !!document.querySelector(
    "[data-testid=chat-messages] [data-testid=user-message], [data-testid=chat-messages] [data-testid=assistant-message]");
  const scrollToEnd = () => {
    window.scrollTo({ top: hasMessages() ? scroller().scrollHeight : 0, behavior: "instant" });
  };
  window.appChat = {
    jumpToLatest() {
      setFollowing(true);
      scrollToEnd();
      const input = document.querySelector("[data-testid=msg-input]");
      if (input) input.focus({ preventScroll: true });
    },
    isFollowing: () => following,
  };

  let lastY = window.scrollY;
  window.addEventListener("scroll", () => {
    const y = window.scrollY;
    if (atBottom()) setFollowing(true);
    else if (y < lastY) setFollowing(false); // only the reader scrolling up stops following
    lastY = y;
  }, { passive: true });
  window.addEventListener("resize", () => { if (following) scrollToEnd(); });

  const onMutations = (mutations) => {
    for (const m of mutations) {
      for (const node of m.addedNodes) {
        if (node.nodeType !== 1) continue;
        const notable = node.matches("[data-testid=turn-error], [data-testid=inject-note]")
          ? node : node.querySelector("[data-testid=turn-error], [data-testid=inject-note]");
        if (notable) { setFollowing(true); }
      }
    }
    decorateCode(observed);
    if (following) scrollToEnd();
  };

  const attach = () => {
    const messages = document.querySelector("[data-testid=chat-messages]");
    if (messages && messages !== observed) {
      if (observer) observer.disconnect();
      observed = messages;
      observer = new MutationObserver(onMutations);
      observer.observe(messages, { childList: true, subtree: true, characterData: true });
      setFollowing(true);
      decorateCode(messages);
      scrollToEnd();
    }
    // The side panel: a new one after the language switch (the page is built again) may arrive with
    // its tasks' code blocks already in it, which no mutation will announce (issue 40): decorate them now.
    const panel = document.querySelector("[data-testid=agent-invoke-panel]");
    if (panel && panel !== observedPanel) {
      if (panelObserver) panelObserver.disconnect();
      observedPanel = panel;
      panelObserver = new MutationObserver(() => decorateCode(panel));
      panelObserver.observe(panel, { childList: true, subtree: true });
      decorateCode(panel);
    }
    for (const el of document.querySelectorAll(".decorate-code")) decorateCode(el);
  };
  setInterval(attach, 250);
  document.addEventListener("DOMContentLoaded", attach);

  // -- code blocks: a language label and a copy button; the block scrolls inside itself --------
  function decorateCode(root) {
    if (!root) return;
    for (const pre of root.querySelectorAll(".nicegui-markdown pre")) {
      if (pre.parentElement && pre.parentElement.classList.contains("code-block")) continue;
      const code = pre.querySelector("code");
      const wrapper = document.createElement("div");
      wrapper.className = "code-block";
      wrapper.dataset.testid = "code-block";
      const bar = document.createElement("div");
      bar.className = "code-block-bar";
      const lang = document.createElement("span");
      lang.className = "code-block-lang";
      lang.dataset.testid = "code-lang";
      // Label and button words are CSS content (attr()), so the message's text (innerText, copy-paste) stays the code.
      lang.dataset.lang = languageOf(pre, code);
      const copy = document.createElement("button");
      copy.type = "button";
      copy.className = "code-copy-btn";
      copy.dataset.testid = "code-copy-btn";
      // The words come from the page's language (ui/language.py sets window.appTexts), English by default.
      const words = Object.assign({copy: "Copy", copyCode: "Copy code", copied: "Copied"}, window.appTexts || {});
      copy.dataset.label = words.copy;
      copy.setAttribute("aria-label", words.copyCode);
      copy.addEventListener("click", async () => {
        const text = (code || pre).innerText;
        try {
          await navigator.clipboard.writeText(text);
        } catch (e) {
          const area = document.createElement("textarea");
          area.value = text; document.body.appendChild(area); area.select();
          try { document.execCommand("copy"); } finally { area.remove(); }
        }
        copy.dataset.label = words.copied;
        copy.dataset.copied = "1";
        setTimeout(() => { copy.dataset.label = words.copy; }, 1500);
      });
      bar.append(lang, copy);
      pre.parentElement.insertBefore(wrapper, pre);
      wrapper.append(bar, pre);
    }
  }
  function languageOf(pre, code) {
    const classes = [...(code ? code.classList : []), ...pre.classList, ...(pre.parentElement?.classList || [])];
    for (const c of classes) {
      const m = /^(?:language|lang)-(.+)$/.exec(c);
      if (m) return m[1];
    }
    const hinted = pre.closest("[data-lang]");
    if (hinted) return hinted.dataset.lang;
    for (const c of classes) {
      if (!["codehilite", "highlight", "code-block"].includes(c) && /^[a-z0-9+#-]+$/.test(c)) return c;
    }
    return "text";
  }
  window.appDecorateCode = decorateCode;

  // -- Tab after the footer's last control: to the open side panel, else back to the top ------
  // (the browser would leave the page for its own toolbar: a Tab that lands on nothing)
  const shown = (el) => !!el && el.offsetParent !== null && !el.disabled;
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Tab" || event.shiftKey || event.altKey || event.ctrlKey || event.metaKey) return;
    const active = document.activeElement;
    if (!active || !active.closest("[data-testid=chat-footer]")) return;
    const stop = document.querySelector("[data-testid=stop-btn]");
    const last = shown(stop) ? stop : document.querySelector("[data-testid=send-btn]");
    if (active !== last) return;
    const panel = document.querySelector("[data-testid=agent-invoke-panel]");
    const inPanel = panel && !panel.closest(".q-layout--prevent-focus") && shown(panel)
      ? [...panel.querySelectorAll("button, [tabindex='0']")].find(shown) : null;
    const next = inPanel || document.querySelector("[data-testid=menu-btn]");
    if (shown(next)) {
      event.preventDefault();
      next.focus();
    }
  });

  // -- files dropped on the chat or pasted into it join the composer's files (issue 36) -------
  // They go to the same hidden uploader as the attach button's (ui/chat_attachments.py), which
  // checks and holds them until the message is sent.
  const uploader = () => {
    const element = document.querySelector(".chat-upload");
    const vm = element && typeof getElement === "function" ? getElement(element) : null;
    return vm && vm.$refs ? vm.$refs.qRef : null;
  };
  const addFiles = (event, files) => {
    const target = files && files.length ? uploader() : null;
    if (!target) return;
    event.preventDefault();
    target.addFiles(files);
  };
  document.addEventListener("paste", (event) => addFiles(event, event.clipboardData && event.clipboardData.files));
  document.addEventListener("dragover", (event) => {
    if (event.dataTransfer && [...event.dataTransfer.types].includes("Files") && uploader()) event.preventDefault();
  });
  document.addEventListener("drop", (event) => addFiles(event, event.dataTransfer && event.dataTransfer.files));

  // -- Esc: the page decides (stop a running reply, else close the side panel) ----------------
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.defaultPrevented) return;
    if (document.querySelector(".q-dialog, .q-menu")) return; // Quasar closes its own popups
    if (typeof emitEvent === "function") emitEvent("app-escape");
  });
})();
