// Loaded after require.js and before the ipywidgets manager (embed-amd.js): point the manager
// at its own copy in _static/widgets/, so its fonts and modules come from this site, not a CDN;
// name the explorers' pictures and sliders for screen readers; bridge MathJax 2's one call.
(function () {
  var src = document.currentScript.src;
  var base = src.substring(0, src.lastIndexOf("/") + 1) + "widgets/";
  window.__jupyter_widgets_assets_path__ = base;
  if (window.require && window.require.config) {
    window.require.config({
      paths: { "@jupyter-widgets/html-manager/dist": base.replace(/\/$/, "") },
    });
  }
  // Names for what the widgets draw without one (ipywidgets gives neither): an explorer's
  // picture gets the alt text its caption carries (selfattn.book.kit.viz writes a heatmap's title
  // and tokens into an empty span's data-selfattn-alt), and a slider's handle the label beside
  // it, with the value it shows as its value text (noUiSlider says the position, 0, 1, 2, ...).
  // Widgets render after the page loads and a slider redraws on every move, so this runs again
  // whenever the widgets change.
  function nameWidgets() {
    document.querySelectorAll("img.widget-image").forEach(function (img) {
      var carrier = img.parentElement && img.parentElement.querySelector("[data-selfattn-alt]");
      var alt = carrier && carrier.getAttribute("data-selfattn-alt");
      if (alt && img.getAttribute("alt") !== alt) img.setAttribute("alt", alt);
    });
    document.querySelectorAll(".widget-slider").forEach(function (box) {
      var label = box.querySelector(".widget-label");
      var readout = box.querySelector(".widget-readout");
      box.querySelectorAll('[role="slider"]').forEach(function (handle) {
        if (label && handle.getAttribute("aria-label") !== label.textContent) {
          handle.setAttribute("aria-label", label.textContent);
        }
        if (readout && handle.getAttribute("aria-valuetext") !== readout.textContent) {
          handle.setAttribute("aria-valuetext", readout.textContent);
        }
      });
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var pending = false;
    new MutationObserver(function () {
      if (pending) return;
      pending = true;
      (window.requestAnimationFrame || setTimeout)(function () { pending = false; nameWidgets(); });
    }).observe(document.body, { childList: true, subtree: true, characterData: true,
                                attributes: true, attributeFilter: ["aria-valuetext"] });
    nameWidgets();
  });

  // The widget manager typesets labels through MathJax 2's MathJax.Hub.Queue; the book loads
  // MathJax 3 (deferred, so it has started by DOMContentLoaded). Bridge the one call it makes.
  document.addEventListener("DOMContentLoaded", function () {
    var mj = window.MathJax;
    if (mj && !mj.Hub) {
      mj.Hub = {
        Queue: function (job) {
          var element = job && job[2];
          if (element && mj.typesetPromise) mj.typesetPromise([element]);
        },
      };
    }
  });
})();
