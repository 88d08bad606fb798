/* Loaded before the Jupyter widget manager (embed-amd.js) on pages with widgets: book/_ext/local_widgets.py. */
(function () {
  "use strict";

  // The manager's bundle takes the folder of its Font Awesome files from its AMD module's address, which
  // require.js resolves against the page (lessons/@jupyter-widgets/html-manager/dist/...): map that module
  // path to this script's folder, where the files are. (window.__jupyter_widgets_assets_path__ is read
  // only after the bundle has built its CSS, too late for the fonts.)
  var script = document.currentScript;
  if (script && script.src && window.requirejs) {
    var folder = script.src.slice(0, script.src.lastIndexOf("/"));
    window.requirejs.config({ paths: { "@jupyter-widgets/html-manager/dist": folder } });
  }

  // @jupyter-widgets/controls typesets widget descriptions with MathJax 2's MathJax.Hub.Queue whenever a
  // window.MathJax exists; the book loads MathJax 3, which has no Hub, and every widget threw
  // "Cannot read properties of undefined (reading 'Queue')". Give whatever window.MathJax becomes (the
  // page's configuration object, then MathJax 3 itself) a Hub that typesets with MathJax 3.
  function typeset(element) {
    var mathjax = window.MathJax;
    if (!mathjax || !mathjax.startup || !mathjax.startup.promise || !mathjax.typesetPromise) {
      return; // MathJax 3 is not running yet: its first pass typesets the page
    }
    mathjax.startup.promise.then(function () {
      return mathjax.typesetPromise([element]);
    }).catch(function (error) {
      console.warn("typesetting a widget failed:", error);
    });
  }

  var hub = {
    Queue: function () {
      for (var i = 0; i < arguments.length; i++) {
        var job = arguments[i];
        if (Array.isArray(job) && job[0] === "Typeset" && job[2]) {
          typeset(job[2]);
        } else if (typeof job === "function") {
          job();
        }
      }
    },
  };

  function withHub(mathjax) {
    if (mathjax && typeof mathjax === "object" && !("Hub" in mathjax)) {
      // not enumerable: MathJax 3 reads its configuration from the object's own enumerable keys
      Object.defineProperty(mathjax, "Hub", { value: hub, configurable: true });
    }
    return mathjax;
  }

  var current = withHub(window.MathJax);
  try {
    Object.defineProperty(window, "MathJax", {
      configurable: true,
      enumerable: true,
      get: function () { return current; },
      set: function (value) { current = withHub(value); },
    });
  } catch (error) {
    console.warn("widgets-setup: window.MathJax cannot be watched; widget descriptions are not typeset", error);
  }
})();
