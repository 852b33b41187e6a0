"""Take the README's screenshot of the explain --html page: writes the page for PROMPT with the model in MODEL_DIR
(`python -m gpt2_numpy.explain PROMPT --model MODEL_DIR --html`), opens it in headless Chromium (selenium), clicks a
token and saves a PNG.

    python -m scripts.demo.screenshot_page PROMPT MODEL_DIR OUT.png [--query 4] [--layer 5]
    python -m scripts.demo.screenshot_page "The cat sat on the mat" weights/124M docs/look-inside.png

Needs the test extra's selenium and Debian's browser: apt-get install chromium chromium-driver; pip install selenium.
"""
import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--query", type=int, help="the token to click (default: the last)")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--head", type=int, default=0)
    parser.add_argument("--size", default="1200,900", help="the window's width,height in pixels")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "page.html"
        subprocess.run([sys.executable, "-m", "gpt2_numpy.explain", "--model", str(args.model_dir), "--html", str(page),
                        "--", args.prompt], check=True)
        screenshot(page, args)
    print(f"wrote {args.out}")


def screenshot(page, args):  # -> None; opens the page offline, chooses layer, head and query, saves args.out
    from selenium.webdriver.support.ui import Select

    driver = opened(page, args.size)
    try:
        Select(driver.find_element("id", "layer")).select_by_value(str(args.layer))
        Select(driver.find_element("id", "head")).select_by_value(str(args.head))
        tokens = driver.find_elements("css selector", "[data-token-index]")
        tokens[len(tokens) - 1 if args.query is None else args.query].click()
        driver.save_screenshot(str(args.out))
    finally:
        driver.quit()


def opened(page, size):  # -> a headless Chromium (selenium) showing the page, once its script is ready
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = Options()
    for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={size}", "--hide-scrollbars"]:
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        driver.get(Path(page).resolve().as_uri())
        WebDriverWait(driver, 120).until(lambda d: d.execute_script("return document.body.dataset.ready"))
    except BaseException:
        driver.quit()
        raise
    return driver

if __name__ == "__main__":
    main()
