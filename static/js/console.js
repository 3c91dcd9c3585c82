// Console behaviour without inline handlers (the Content-Security-Policy allows no inline
// script without a nonce): forms with data-confirm ask first, selects with data-autosubmit
// submit their form, selects with data-navigate open the chosen option's URL, buttons with
// data-copy="<element id>" copy that element's text to the clipboard.
document.addEventListener("submit", (ev) => {
  const msg = ev.target.getAttribute && ev.target.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) ev.preventDefault();
}, true);
document.addEventListener("change", (ev) => {
  const el = ev.target;
  if (el.matches && el.matches("select[data-autosubmit]")) el.form.submit();
  if (el.matches && el.matches("select[data-navigate]") && el.value) window.location.href = el.value;
});
document.addEventListener("click", (ev) => {
  const btn = ev.target.closest && ev.target.closest("button[data-copy]");
  if (!btn) return;
  const el = document.getElementById(btn.getAttribute("data-copy"));
  if (!el) return;
  const done = () => { const was = btn.textContent; btn.textContent = "Copied"; setTimeout(() => { btn.textContent = was; }, 1500); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(el.textContent).then(done);
  } else {   // plain http on a LAN address: select the text for Ctrl-C
    const range = document.createRange(); range.selectNodeContents(el);
    const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(range);
    try { document.execCommand("copy"); done(); } catch (e) { /* selected: copy by hand */ }
  }
});
