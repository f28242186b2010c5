"""The example on the course page (book/course/index.md) is run as a doctest: it prints what it shows."""

import doctest
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "book" / "course" / "index.md"


def test_the_course_pages_example_prints_what_it_shows():
    blocks = re.findall(r"```python\n(>>> .*?)```", PAGE.read_text(), flags=re.S)
    assert blocks, f"no >>> example in {PAGE}"
    for block in blocks:
        test = doctest.DocTestParser().get_doctest(block, {}, PAGE.name, str(PAGE), 0)
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        runner.run(test)
        assert runner.failures == 0, f"the example in {PAGE} prints something else (see the doctest output above)"
