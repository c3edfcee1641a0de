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

// No re-typeset hook on Material's `document$`: instant navigation is off
// (mkdocs.yml), MathJax typesets each page once at load. (Clearing its
// cache and typesetting again at load, as the usual hook does, left the
// glyphs' CSS out: blank formulas.)
