"""The README's rewrite example runs and prints what its comment says."""

import contextlib
import io
import os
import re

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_use_example_prints_the_summary_its_comment_shows():
    with open(README) as f:
        text = f.read()
    section = text.split("## Use", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    expected = re.search(r"print\(result\.report\.summary\(\)\)\s+# (.*)", code).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})  # pylint: disable=exec-used
    assert out.getvalue().strip().splitlines()[0] == expected.strip()
