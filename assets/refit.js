// Refit every cytoscape graph to its box when the window is resized (debounced): the canvas
// keeps its old size and zoom otherwise, leaving the graph cut off or lost in a corner.
(function () {
    let timer = null;
    function refit() {
        document.querySelectorAll('div').forEach(function (el) {
            const cy = el._cyreg && el._cyreg.cy;
            if (cy) { cy.resize(); cy.fit(undefined, 20); }
        });
    }
    window.addEventListener('resize', function () {
        clearTimeout(timer);
        timer = setTimeout(refit, 150);
    });
})();
