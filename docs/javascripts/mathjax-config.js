// MathJax 3 configuration for pymdownx.arithmatex (generic mode): formulas
// are written \( ... \) and \[ ... \] inside elements of class "arithmatex".
// MathJax itself is vendored (docs/javascripts/mathjax, from the npm package
// mathjax@3, Apache-2.0): the site renders formulas offline.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};

// Material for MkDocs: typeset again after an instant page change.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && MathJax.typesetPromise) {
      MathJax.startup.output.clearCache();
      MathJax.typesetClear();
      MathJax.texReset();
      MathJax.typesetPromise();
    }
  });
}
