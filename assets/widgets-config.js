// Loaded after require.js and before the ipywidgets manager (embed-amd.js): point the manager
// at its own copy in _static/widgets/, so its fonts and modules come from this site, not a CDN.
(function () {
  var src = document.currentScript.src;
  var base = src.substring(0, src.lastIndexOf("/") + 1) + "widgets/";
  window.__jupyter_widgets_assets_path__ = base;
  if (window.require && window.require.config) {
    window.require.config({
      paths: { "@jupyter-widgets/html-manager/dist": base.replace(/\/$/, "") },
    });
  }
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
