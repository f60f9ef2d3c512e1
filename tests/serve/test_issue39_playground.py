"""Issue #39: the playground at 485 px wide, in a real headless browser (Debian's chromium and
chromedriver through selenium, as tests/serve/test_playground.py, whose fixtures and helpers this uses).

"Look inside" on a long text makes the logit-lens table wider than the window; the page must not scroll
sideways (the panel shrinks and scrolls inside). The test first checks that the table is that wide, and
last that the page would scroll sideways without the panel's rules, so it cannot pass by being vacuous.
"""

from __future__ import annotations

import pytest

# Importing it skips this module where selenium or chromium is missing, as it skips itself.
from test_playground import By, browser, open_page, server, set_value, wait  # noqa: F401  (fixtures)

NARROW = 485
#: Words whose tokens are long, so the lens's cells (the top tokens, whatever the random model ranks
#: first) and the token strip are wide.
LONG_TEXT = ("Internationalization and counterrevolutionaries notwithstanding, the electroencephalographers "
             "reconsidered their institutionalized responsibilities. ") * 6


def page_overflow(driver) -> tuple[int, int]:
    return driver.execute_script("const e = document.documentElement; return [e.scrollWidth, e.clientWidth];")


def test_look_inside_a_long_text_does_not_scroll_the_page_sideways_at_485_px(browser, server):  # noqa: F811
    driver = browser
    before = driver.get_window_size()
    try:
        driver.set_window_size(NARROW, 900)
        open_page(driver, server)
        inner = driver.execute_script("return window.innerWidth;")
        assert inner <= NARROW, inner
        assert page_overflow(driver)[0] <= page_overflow(driver)[1]  # the page itself fits before
        driver.find_element(By.ID, "mode-inspect").click()
        set_value(driver, "prompt", LONG_TEXT)
        driver.find_element(By.ID, "generate").click()
        wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#lens tr.lens-row")) > 0)
        lens = driver.execute_script("return document.getElementById('lens').scrollWidth;")
        assert lens > inner, f"the lens table is {lens} px, no wider than the window: this proves nothing"
        scroll, client = page_overflow(driver)
        assert scroll <= client, f"the page scrolls sideways: {scroll} px of content in {client} px"
        # Without the panel's rules (a flex item is as wide as its content) the same page overflows.
        driver.execute_script("for (const f of document.querySelectorAll('.inspect-panels figure'))"
                              "  Object.assign(f.style, {minWidth: 'auto', maxWidth: 'none',"
                              "                          overflowX: 'visible'});")
        scroll, client = page_overflow(driver)
        assert scroll > client, (scroll, client)
    finally:
        driver.set_window_size(before["width"], before["height"])


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
