// Console behaviour without inline handlers (the Content-Security-Policy allows no inline
// script without a nonce): forms with data-confirm ask first, selects with data-autosubmit
// submit their form, selects with data-navigate open the chosen option's URL.
document.addEventListener("submit", (ev) => {
  const msg = ev.target.getAttribute && ev.target.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) ev.preventDefault();
}, true);
document.addEventListener("change", (ev) => {
  const el = ev.target;
  if (el.matches && el.matches("select[data-autosubmit]")) el.form.submit();
  if (el.matches && el.matches("select[data-navigate]") && el.value) window.location.href = el.value;
});
