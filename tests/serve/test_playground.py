"""The playground (``GET /``) in a real headless browser: Debian's chromium and chromedriver through
selenium, against a server subprocess with a small random model (context 1024).

Needs ``apt-get install -y chromium chromium-driver`` and ``pip install selenium``; skipped without them.

Screenshot of the page after a generation (docs/playground.png):

    python tests/serve/test_playground.py --screenshot docs/playground.png

(the same as ``PLAYGROUND_SCREENSHOT=docs/playground.png pytest tests/serve/test_playground.py -k
screenshot``). "Look inside" (docs/images/inspect.png): ``INSPECT_SCREENSHOT=docs/images/inspect.png pytest
tests/serve/test_playground.py -k inspect_screenshot``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

if __name__ != "__main__":
    pytest.importorskip("selenium", reason="the playground's browser tests need selenium "
                        "(pip install selenium)")
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        if os.environ.get("CI"):  # CI installs them: their absence there is a failure, not a skip
            raise RuntimeError(f"CI: {CHROMIUM} and {CHROMEDRIVER} are missing (.ci/run installs them)")
        pytest.skip(f"the playground's browser tests need {CHROMIUM} and {CHROMEDRIVER} "
                    "(apt-get install -y chromium chromium-driver)", allow_module_level=True)

    import httpx
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from serve_helpers import launch

TIMEOUT = 20  # seconds for anything the page should do


@pytest.fixture(scope="module")
def server(long_model_dir, tmp_path_factory):
    s = launch(long_model_dir, "--slots", "2", home=tmp_path_factory.mktemp("playground"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def pipe(long_model_dir):
    import inferno

    return inferno.load(long_model_dir, "numpy", download=False)


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="playground-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # with the driver's path: Selenium Manager downloads nothing
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", f"--user-data-dir={profile}", "--window-size=1100,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(TIMEOUT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver, condition, timeout: float = TIMEOUT):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: condition(d))


def open_page(driver, server):
    driver.get(server.url + "/")
    wait(driver, lambda d: d.find_element(By.ID, "model-name").text.startswith("Model:"))
    driver.get_log("browser")  # start each test with an empty log


def set_value(driver, element_id: str, value: str) -> None:
    # Typing thousands of characters with send_keys is slow; set it as a paste would, then tell the page.
    el = driver.find_element(By.ID, element_id)
    driver.execute_script("arguments[0].value = arguments[1];"
                          "arguments[0].dispatchEvent(new Event('input', {bubbles: true}));", el, value)


def text_of(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def severe(driver) -> list:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def generate(driver, prompt: str, max_tokens: int, **fields: str) -> None:
    set_value(driver, "prompt", prompt)
    set_value(driver, "max_tokens", str(max_tokens))
    for name, value in fields.items():
        set_value(driver, name, value)
    driver.find_element(By.ID, "generate").click()


def done(driver) -> bool:
    return text_of(driver, "status") in ("Done.", "Error.", "Stopped.")


# The page's formatting (app.js fmtProb and visible).
def fmt_prob(p: float) -> str:
    if p >= 0.001:
        return f"{p * 100:.2f}%"
    mantissa, exponent = f"{p:.2e}".split("e")
    return f"{mantissa}e{int(exponent):+d}"


def visible(text: str) -> str:
    return text.replace(" ", "\u2423").replace("\n", "\u23ce").replace("\t", "\u21e5")


# ------------------------------------------------------------------------------------------------ tests


def test_the_page_loads_without_console_errors(browser, server):
    driver = browser
    driver.get(server.url + "/")
    wait(driver, lambda d: d.find_element(By.ID, "model-name").text.startswith("Model:"))
    assert driver.title == "inferno playground"
    assert severe(driver) == []
    # Every control has a label.
    for el in driver.find_elements(By.CSS_SELECTOR, "input:not([type=radio]):not([type=checkbox]), textarea"):
        name = el.get_attribute("id")
        assert driver.find_elements(By.CSS_SELECTOR, f"label[for={name}]"), name
    assert driver.find_element(By.ID, "max_tokens").get_attribute("value") == "50"
    assert driver.find_element(By.ID, "temperature").get_attribute("value") == "0"


def test_tokens_stream_in_with_the_apis_probabilities_and_ids(browser, server):
    driver = browser
    open_page(driver, server)
    generate(driver, "The quick brown fox", 12, seed="3")
    wait(driver, done)
    assert text_of(driver, "status") == "Done."
    spans = driver.find_elements(By.CSS_SELECTOR, "#output .tok")

    body = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0, "seed": 3, "top_k": 0,
            "top_p": 1, "repetition_penalty": 1, "logprobs": 5, "return_token_ids": True}
    choice = httpx.post(server.url + "/v1/completions", json=body, timeout=30).json()["choices"][0]
    lp = choice["logprobs"]
    assert len(spans) == len(lp["tokens"]) >= 1
    assert [int(s.get_attribute("data-id")) for s in spans] == lp["token_ids"]
    assert "".join(s.text for s in spans) == choice["text"]
    assert text_of(driver, "finish-reason") == f"Finish reason: {choice['finish_reason']}"
    assert "tokens/s" in text_of(driver, "tokens-per-second")

    for k in (0, len(spans) - 1):
        spans[k].send_keys("")  # keyboard focus
        driver.execute_script("arguments[0].focus()", spans[k])
        tip = driver.find_element(By.ID, "tip")
        wait(driver, lambda d, tip=tip: tip.is_displayed())
        rows = [[td.text for td in row.find_elements(By.TAG_NAME, "td")]
                for row in tip.find_elements(By.CSS_SELECTOR, "tr.alt")]
        expected = [[str(r + 1), visible(text), fmt_prob(math.exp(logprob)), str(tid)]
                    for r, ((text, logprob), tid) in enumerate(zip(lp["top_logprobs"][k].items(),
                                                                   lp["top_token_ids"][k], strict=False))][:5]
        assert rows == expected
        chosen = fmt_prob(math.exp(lp["token_logprobs"][k]))
        assert f"(id {lp['token_ids'][k]}): probability {chosen}, rank 1 of the top 5" in tip.text  # greedy

    driver.find_element(By.ID, "show-ids").click()
    assert "show-ids" in driver.find_element(By.ID, "output").get_attribute("class")
    assert severe(driver) == []


def test_stop_cancels_the_stream_and_frees_the_slot(browser, server):
    driver = browser
    open_page(driver, server)
    generate(driver, "Once upon a time", 1000, temperature="1", seed="7")
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#output .tok")) >= 3)
    driver.find_element(By.ID, "stop-button").click()
    wait(driver, done)
    assert text_of(driver, "status") == "Stopped."
    shown = len(driver.find_elements(By.CSS_SELECTOR, "#output .tok"))
    assert shown < 1000
    deadline = time.monotonic() + 10
    while True:
        health = server.health().json()
        if health["slots_free"] == health["slots_total"] and health["requests_running"] == 0:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.05)
    time.sleep(0.2)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#output .tok")) == shown  # nothing more arrives
    assert driver.find_element(By.ID, "generate").is_enabled()
    assert severe(driver) == []


def test_a_too_long_prompt_shows_the_error_beside_the_prompt(browser, server):
    driver = browser
    open_page(driver, server)
    generate(driver, "hello " * 1100, 5)
    wait(driver, lambda d: text_of(d, "err-prompt") != "")
    message = text_of(driver, "err-prompt")
    assert "maximum context length is 1024 tokens" in message and "{" not in message
    assert driver.find_element(By.ID, "prompt").get_attribute("aria-invalid") == "true"
    assert text_of(driver, "err-general") == ""
    # Another control's error (pydantic's, param top_p) is shown beside that control.
    set_value(driver, "prompt", "Hi")
    set_value(driver, "top_p", "1.5")
    driver.find_element(By.ID, "generate").click()
    wait(driver, lambda d: text_of(d, "err-top_p") != "")
    assert text_of(driver, "err-top_p") == "Top-p: Input should be less than or equal to 1"
    assert text_of(driver, "err-prompt") == "" and text_of(driver, "err-general") == ""


def test_score_mode_shows_the_perplexity_of_pipeline_score(browser, server, pipe):
    driver = browser
    open_page(driver, server)
    text = "The cat sat on the mat, and then it went to sleep."
    driver.find_element(By.ID, "mode-score").click()
    assert not driver.find_element(By.ID, "controls").is_displayed()
    set_value(driver, "prompt", text)
    driver.find_element(By.ID, "prompt").send_keys("\ue009\ue007")  # Ctrl+Enter
    wait(driver, lambda d: text_of(d, "perplexity") != "")
    result = pipe.score(text)
    ppl = result.perplexity  # the page shows 6 significant digits, whole numbers from a million
    digits = f"{ppl:#.6g}".rstrip(".") if ppl < 1e6 else f"{ppl:.0f}"
    assert text_of(driver, "perplexity") == f"Perplexity: {digits} ({len(result.ids) - 1} tokens scored)"
    spans = driver.find_elements(By.CSS_SELECTOR, "#output .tok")
    assert [int(s.get_attribute("data-id")) for s in spans] == result.ids
    assert "".join(s.text for s in spans) == text
    assert severe(driver) == []


def test_a_regex_constraint_shapes_the_output_and_forced_tokens_look_different(browser, server):
    from selenium.webdriver.support.ui import Select

    driver = browser
    open_page(driver, server)
    assert not driver.find_element(By.ID, "constraint").is_displayed()  # kind "None": no box
    Select(driver.find_element(By.ID, "constraint_kind")).select_by_value("regex")
    assert driver.find_element(By.ID, "constraint").is_displayed()
    pattern = r"[0-9]{3}-[a-z]{2}\."
    set_value(driver, "constraint", pattern)
    generate(driver, "Code:", 20, temperature="1", seed="7")
    wait(driver, done)
    assert text_of(driver, "status") == "Done.", text_of(driver, "err-general")
    spans = driver.find_elements(By.CSS_SELECTOR, "#output .tok")
    assert re.fullmatch(pattern, "".join(s.text for s in spans))
    forced = [s for s in spans if "forced" in s.get_attribute("class").split()]
    # After the letters only "." ends the pattern: the constraint forced it; the digits were chosen.
    assert forced and forced[-1] == spans[-1] and spans[-1].text == "." and len(forced) < len(spans)
    style = "return getComputedStyle(arguments[0]).fontStyle"
    assert driver.execute_script(style, forced[-1]) == "italic"
    chosen = next(s for s in spans if s not in forced)
    assert driver.execute_script(style, chosen) == "normal"
    driver.execute_script("arguments[0].focus()", forced[-1])
    tip = driver.find_element(By.ID, "tip")
    wait(driver, lambda d: tip.is_displayed())
    assert "Forced by the constraint" in tip.text
    driver.execute_script("arguments[0].focus()", chosen)
    wait(driver, lambda d: "Forced by the constraint" not in tip.text)
    assert severe(driver) == []
    # The server's 400 for a pattern it cannot use is shown beside the box, under the box's name.
    set_value(driver, "constraint", "[0-9")
    driver.find_element(By.ID, "generate").click()
    wait(driver, lambda d: text_of(d, "err-constraint") != "")
    assert text_of(driver, "err-constraint").startswith("Regular expression")
    assert driver.find_element(By.ID, "constraint").get_attribute("aria-invalid") == "true"


def test_screenshot(browser, server, tmp_path):
    """The page after a generation, with a token's alternatives open, as a picture: saved to
    $PLAYGROUND_SCREENSHOT (docs/playground.png), else to a temporary file; either way it must be a
    PNG of the window's size that is not blank."""
    path = os.environ.get("PLAYGROUND_SCREENSHOT") or str(tmp_path / "playground.png")
    driver = browser
    driver.set_window_size(1100, 1150)  # room for the alternatives under the output
    open_page(driver, server)
    generate(driver, "The meaning of life is", 40, temperature="0.8", seed="1", top_k="40")
    wait(driver, done)
    spans = driver.find_elements(By.CSS_SELECTOR, "#output .tok")
    driver.execute_script("arguments[0].focus()", spans[min(5, len(spans) - 1)])
    wait(driver, lambda d: d.find_element(By.ID, "tip").is_displayed())
    assert driver.find_element(By.ID, "tip").text.strip()  # the alternatives are in the picture
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(path))
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 800 and height >= 600, (width, height)
    assert len(data) > 20_000  # a blank page compresses to a few kB


# ------------------------------------------------------------------------------------------ look inside


def heat(v: float) -> int:
    """The red (and green) channel of a heatmap cell of weight v (app.js heat): 255 white, 0 full blue."""
    return math.floor(255 * (1 - min(1.0, max(0.0, v))) + 0.5)


def inspect_api(server, ids: list[int], layer: int, position: int) -> dict:
    body = {"prompt": ids, "layers": [layer], "positions": [position], "top": 5}
    r = httpx.post(server.url + "/v1/inspect", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def heatmap_channels(driver) -> dict[int, list[list[int]]]:
    """Each drawn heatmap's red channel, by head: [query][key]."""
    return driver.execute_script("""
        const out = {};
        for (const fig of document.querySelectorAll('#heatmaps .heatmap')) {
          const c = fig.querySelector('canvas');
          const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          const rows = [];
          for (let i = 0; i < c.height; i++) {
            const row = [];
            for (let j = 0; j < c.width; j++) row.push(data[4 * (i * c.width + j)]);
            rows.push(row);
          }
          out[fig.dataset.head] = rows;
        }
        return out;""")


def lens_cells(driver) -> list[list[tuple[int, float, bool]]]:
    return [[(int(td.get_attribute("data-id")), float(td.get_attribute("data-p")),
              "chosen" in (td.get_attribute("class") or "")) for td in row.find_elements(By.TAG_NAME, "td")]
            for row in driver.find_elements(By.CSS_SELECTOR, "#lens tr.lens-row")]


def selected(driver) -> int:
    span = driver.find_element(By.CSS_SELECTOR, "#inspect-tokens [aria-selected=true]")
    return int(span.get_attribute("data-sel"))


def assert_drawn(driver, api: dict, heads: list[int]) -> None:
    channels = heatmap_channels(driver)
    assert sorted(int(h) for h in channels) == heads
    for h in heads:
        want = [[heat(v) for v in row] for row in api["attention"][0][h]]
        assert channels[str(h)] == want, f"head {h}"


def test_look_inside_draws_the_apis_attention_and_logit_lens(browser, server):
    driver = browser
    open_page(driver, server)
    driver.find_element(By.ID, "mode-inspect").click()
    assert not driver.find_element(By.ID, "controls").is_displayed()
    assert text_of(driver, "generate") == "Look inside"
    text = "The quick brown fox jumps over"
    set_value(driver, "prompt", text)
    driver.find_element(By.ID, "prompt").send_keys("\ue009\ue007")  # Ctrl+Enter
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#lens tr.lens-row")) > 0)
    ids = httpx.post(server.url + "/tokenize", json={"content": text}, timeout=30).json()["tokens"]
    t = len(ids)
    strip = driver.find_elements(By.CSS_SELECTOR, "#inspect-tokens .tok")
    assert [int(s.get_attribute("data-id")) for s in strip[:-1]] == ids and len(strip) == t + 1
    assert selected(driver) == t  # "what comes next" after the text
    api = inspect_api(server, ids, 0, t - 1)
    assert "".join(s.text for s in strip[:-1]) == "".join(api["tokens"])
    n_head, n_layer = len(api["heads"]), len(api["logit_lens"]) - 1
    assert_drawn(driver, api, list(range(n_head)))  # every head of block 0: the small multiples
    # The lens after the last token, every layer, most likely first; nothing chosen yet (it is the future).
    assert lens_cells(driver) == [[(e["token_id"], e["probability"], False) for e in layer[0]]
                                  for layer in api["logit_lens"]]
    assert len(lens_cells(driver)) == n_layer + 1
    assert "attends most to" in text_of(driver, "attends")

    # Another block, one head: the selectors ask the server for what is new.
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, "layer")).select_by_value(str(n_layer - 1))
    api = inspect_api(server, ids, n_layer - 1, t - 1)
    head0 = [[heat(v) for v in r] for r in api["attention"][0][0]]
    wait(driver, lambda d: heatmap_channels(d).get("0") == head0)
    Select(driver.find_element(By.ID, "head")).select_by_value("2")
    assert_drawn(driver, api, [2])

    # The keyboard: the arrow keys move the selection; token s is the model choosing it at s - 1.
    driver.find_element(By.CSS_SELECTOR, "#inspect-tokens [aria-selected=true]").send_keys("\ue012")  # Left
    wait(driver, lambda d: selected(d) == t - 1)
    api = inspect_api(server, ids, n_layer - 1, t - 2)
    wait(driver, lambda d: [[c[:2] for c in row] for row in lens_cells(d)]
         == [[(e["token_id"], e["probability"]) for e in layer[0]] for layer in api["logit_lens"]])
    for row, layer in zip(lens_cells(driver), api["logit_lens"], strict=True):
        assert [c[2] for c in row] == [e["token_id"] == ids[t - 1] for e in layer[0]]  # the chosen, outlined
    assert f"position {t - 2}" in text_of(driver, "lens-caption")
    active = driver.switch_to.active_element
    assert active.get_attribute("data-sel") == str(t - 1)  # focus follows the selection
    active.send_keys("\ue011")  # Home: the first token has no prediction
    wait(driver, lambda d: selected(d) == 0)
    wait(driver, lambda d: "first token has no prediction" in text_of(d, "lens-caption"))
    assert severe(driver) == []


def test_a_click_on_a_generated_or_scored_token_opens_it(browser, server):
    driver = browser
    open_page(driver, server)
    prompt = "Once upon a time"
    generate(driver, prompt, 6, seed="2")
    wait(driver, done)
    spans = driver.find_elements(By.CSS_SELECTOR, "#output .tok")
    spans[2].click()
    wait(driver, lambda d: d.find_element(By.ID, "inspect").is_displayed()
         and len(d.find_elements(By.CSS_SELECTOR, "#lens tr.lens-row")) > 0)
    prompt_ids = httpx.post(server.url + "/tokenize", json={"content": prompt}, timeout=30).json()["tokens"]
    ids = prompt_ids + [int(s.get_attribute("data-id")) for s in spans]
    strip = driver.find_elements(By.CSS_SELECTOR, "#inspect-tokens .tok")
    assert [int(s.get_attribute("data-id")) for s in strip[:-1]] == ids
    sel = len(prompt_ids) + 2
    assert selected(driver) == sel
    api = inspect_api(server, ids, 0, sel - 1)
    cells = lens_cells(driver)
    assert [[c[:2] for c in row] for row in cells] == [[(e["token_id"], e["probability"]) for e in layer[0]]
                                                       for layer in api["logit_lens"]]
    # Greedy: the chosen token is the output layer's first.
    assert cells[-1][0][0] == ids[sel] and cells[-1][0][2]
    # A scored text: token k is position k.
    driver.find_element(By.ID, "mode-score").click()
    set_value(driver, "prompt", "The cat sat on the mat.")
    driver.find_element(By.ID, "generate").click()
    wait(driver, lambda d: text_of(d, "perplexity") != "")
    spans = driver.find_elements(By.CSS_SELECTOR, "#output .tok")
    driver.execute_script("arguments[0].focus()", spans[3])
    spans[3].send_keys("\ue007")  # Enter
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#inspect-tokens .tok")) == len(spans) + 1
         and selected(d) == 3)
    assert severe(driver) == []


def test_inspect_screenshot(browser, server, tmp_path):
    """"Look inside" as a picture (docs/images/inspect.png with $INSPECT_SCREENSHOT): every head of a block
    and the logit lens of a token; a PNG of the window's size that is not blank."""
    path = os.environ.get("INSPECT_SCREENSHOT") or str(tmp_path / "inspect.png")
    driver = browser
    driver.set_window_size(1100, 1250)
    open_page(driver, server)
    driver.find_element(By.ID, "mode-inspect").click()
    set_value(driver, "prompt", "The quick brown fox jumps over the lazy dog because it")
    driver.find_element(By.ID, "generate").click()
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#lens tr.lens-row")) > 0)
    driver.find_element(By.CSS_SELECTOR, "#inspect-tokens [aria-selected=true]").send_keys("\ue012")
    wait(driver, lambda d: "outlined" in text_of(d, "lens-caption"))
    driver.execute_script("document.getElementById('inspect').scrollIntoView()")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(path))
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(data[16:20], "big") >= 800 and len(data) > 20_000


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) != 2 or args[0] != "--screenshot":
        sys.exit("usage: python tests/serve/test_playground.py --screenshot docs/playground.png")
    os.environ["PLAYGROUND_SCREENSHOT"] = str(Path(args[1]).resolve())
    sys.exit(pytest.main([__file__, "-q", "-k", "screenshot", "-p", "no:cacheprovider"]))
