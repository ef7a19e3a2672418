"""The docs' pictures without a browser: `docs/images` holds exactly the screenshots the browser test
takes (tests/docs/screenshots.py), every one of them is shown on a docs page, and every image a page
shows exists."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.screenshots import IMAGES, SHOTS, THEMES, expected_files, file_name

DOCS = IMAGES.parent
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)#\s]+)")


def shown() -> dict[Path, list[Path]]:
    """Each image a docs page shows (resolved) -> the pages showing it."""
    found: dict[Path, list[Path]] = {}
    for page in sorted(DOCS.rglob("*.md")):
        for target in IMAGE.findall(page.read_text()):
            found.setdefault((page.parent / target).resolve(), []).append(page)
    return found


def test_the_images_are_exactly_the_screenshots():
    assert {path.name for path in IMAGES.iterdir()} == expected_files()


def test_every_image_a_page_shows_exists():
    missing = {str(image): [str(p.relative_to(DOCS)) for p in pages] for image, pages in shown().items()}
    missing = {image: pages for image, pages in missing.items() if not Path(image).is_file()}
    assert not missing, missing


def test_every_screenshot_is_shown_in_both_themes_on_some_page():
    images = shown()
    unshown = sorted(path.name for path in IMAGES.iterdir() if path.resolve() not in images)
    assert not unshown, f"images no docs page shows: {unshown}"
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for shot in SHOTS:
            light, dark = (file_name(shot, theme) for theme in THEMES)
            # Material shows `#only-light` in the light theme and `#only-dark` in the dark one.
            assert (f"{light}#only-light" in text) == (f"{dark}#only-dark" in text), (page, shot.name)
