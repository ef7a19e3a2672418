"""Invisible and direction-changing characters are shown, not obeyed, on task and approval pages (item 8).

Reproduced before: a right-to-left override (U+202E) in a task's input reached the approver raw, so
``visa-\\u202e4321`` read as ``visa-1234`` on the page where money is approved.
"""

from __future__ import annotations

import pytest
from django.template import Context, Template

from console.templatetags.invisibles import show_in_html, visible
from tests.conftest import REFUND_INPUT, make_task
from tests.console.test_approvals import ask, client_for

pytestmark = pytest.mark.django_db

RLO = "\u202e"
CARD = f"visa-{RLO}1881"


def render(text, autoescape: bool = True) -> str:
    template = "{% load invisibles %}" + (
        "{{ text|visible }}" if autoescape else "{% autoescape off %}{{ text|visible }}{% endautoescape %}"
    )
    return Template(template).render(Context({"text": text}))


@pytest.mark.parametrize(
    ("char", "code"),
    [
        ("\u202a", "U+202A"),  # left-to-right embedding
        ("\u202e", "U+202E"),  # right-to-left override
        ("\u2066", "U+2066"),  # left-to-right isolate
        ("\u2069", "U+2069"),  # pop directional isolate
        ("\u200b", "U+200B"),  # zero width space
        ("\u200f", "U+200F"),  # right-to-left mark
        ("\ufeff", "U+FEFF"),  # byte order mark
        ("\u00ad", "U+00AD"),  # soft hyphen (Cf)
        ("\x07", "U+0007"),  # bell (Cc)
        ("\x1b", "U+001B"),  # escape (Cc)
        ("\u2028", "U+2028"),  # line separator
        ("\U000e0041", "U+E0041"),  # tag latin capital a (Cf): invisible "ASCII smuggling"
    ],
)
def test_each_hidden_character_is_written_out_with_its_name(char, code):
    html = render(f"a{char}b")
    assert char not in html
    assert f"⟨{code}⟩" in html
    assert html.startswith('a<span class="invisible-char" title="') and html.endswith("</span>b")


def test_tab_newline_and_ordinary_text_are_left_as_they_are():
    text = "line one\n\tindented é 😀 עברית\r\nend"
    assert visible(text) is text
    assert render(text) == text


def test_text_around_a_marker_is_still_escaped():
    html = render(f"<b>{RLO}</b>")
    assert html.startswith("&lt;b&gt;<span") and html.endswith("</span>&lt;/b&gt;")
    assert "<b>" not in html


def test_values_that_are_not_text_are_unchanged():
    for value in (None, 7, 1.5, ["a"], {"k": RLO}):
        assert visible(value) is value


def test_autoescape_off_still_shows_the_marker():
    assert "⟨U+202E⟩" in render(f"x{RLO}y", autoescape=False)


def bidi_task(acme):
    return make_task(acme, objective=f"Refund {CARD}", input={**REFUND_INPUT, "order_id": CARD})


def test_a_bidi_override_in_a_tasks_input_is_shown_on_its_task_page(acme, operator):
    task = bidi_task(acme)
    page = client_for(operator).get(f"/console/tasks/{task.id}/").content.decode()
    assert 'visa-<span class="invisible-char"' in page and "⟨U+202E⟩</span>1881" in page
    assert RLO not in page


def test_a_bidi_override_in_a_tasks_input_is_shown_on_its_approval_page(acme, operator, approver):
    request = ask(bidi_task(acme))
    client = client_for(approver)
    page = client.get(f"/console/approvals/{request.id}/").content.decode()
    assert "⟨U+202E⟩" in page
    assert RLO not in page
    inbox = client.get("/console/approvals/").content.decode()
    assert "⟨U+202E⟩" in inbox and RLO not in inbox


# --- the one hook: every rendered page (issue 20, item 6) -------------------------------------------


def test_a_page_shows_hidden_characters_as_spans_in_text_and_plain_markers_elsewhere():
    page = (
        f'<title>t{RLO}</title><p title="a{RLO}b">x{RLO}y</p><!-- {RLO} -->'
        f'<textarea name="r">r{RLO}</textarea><script type="application/json">"{RLO}"</script>'
    )
    shown = show_in_html(page)
    assert RLO not in shown
    span = '<span class="invisible-char" title="right-to-left override">⟨U+202E⟩</span>'
    assert f'<p title="a⟨U+202E⟩b">x{span}y</p>' in shown
    assert "<title>t⟨U+202E⟩</title>" in shown and "<!-- ⟨U+202E⟩ -->" in shown
    assert '<textarea name="r">r⟨U+202E⟩</textarea>' in shown and '"⟨U+202E⟩"</script>' in shown


def test_a_page_without_hidden_characters_is_returned_as_it_is():
    page = "<p>é — “quoted” 😀 עברית\u00a0</p>\n\t"
    assert show_in_html(page) is page


def test_every_html_answer_passes_the_hook_and_data_answers_do_not(operator, acme):
    task = bidi_task(acme)
    client = client_for(operator)
    page = client.get("/console/").content.decode()
    assert "⟨U+202E⟩" in page and RLO not in page
    exported = b"".join(client.get("/console/export.csv").streaming_content).decode()
    assert CARD in exported  # an export is data, byte for byte
    assert task.objective in client.get(f"/api/tasks/{task.id}/").json()["objective"]
