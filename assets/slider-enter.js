// Enter in a slider's number box moves the slider: Dash's slider takes a typed value only
// when its box loses focus, so a person who types a step and presses Enter saw nothing happen.
(function () {
    document.addEventListener('keydown', function (e) {
        if (e.key === 'Enter' && e.target instanceof HTMLInputElement &&
                e.target.classList.contains('dash-range-slider-input')) {
            e.target.blur();
        }
    }, true);
})();
