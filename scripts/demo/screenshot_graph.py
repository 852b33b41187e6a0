"""Take the screenshot of an attribution graph's page: opens the graph.html that `circuits graph` wrote in headless
Chromium (selenium), clicks a node (by its index in graph.npz's adjacency; by default the page's own choice, the
likeliest logit) and saves a PNG.

    python -m scripts.demo.screenshot_graph GRAPH_HTML OUT.png [--node N] [--size 1400,900]
    python -m scripts.demo.screenshot_graph to-be/graph.html docs/circuits-graph.png --node 12

Needs the test extra's selenium and Debian's browser: apt-get install chromium chromium-driver; pip install selenium.
"""
import argparse
from pathlib import Path

from scripts.demo.screenshot_page import opened


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, help="a graph.html")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--node", type=int, help="the node to click, by its index in graph.npz's adjacency")
    parser.add_argument("--size", default="1400,900", help="the window's width,height in pixels")
    args = parser.parse_args()
    driver = opened(args.page, args.size)
    try:
        if args.node is not None:
            driver.find_element("css selector", f'.node[data-index="{args.node}"] :is(circle, rect)').click()
        driver.save_screenshot(str(args.out))
    finally:
        driver.quit()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
