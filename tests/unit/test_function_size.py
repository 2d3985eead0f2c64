"""No function in gossiprl/ is over MAX_LINES lines: one a newcomer can read in one screen or two."""

import ast
from pathlib import Path

import gossiprl

PACKAGE = Path(gossiprl.__file__).parent
MAX_LINES = 80


def long_functions(source: str, name: str, limit: int = MAX_LINES) -> list[str]:
    """``name:line function (n lines)`` for every function or method of ``source`` over ``limit``
    lines, decorators included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = node.end_lineno - first + 1
            if lines > limit:
                found.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_the_package_is_over_80_lines():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += long_functions(path.read_text(), str(path.relative_to(PACKAGE)))
    assert found == []


def test_the_check_sees_a_long_function_and_a_long_method():
    """The test above would pass on a check that found nothing; this one would not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    source = f"@decorated\ndef long():\n{body}\n\nclass C:\n    def short(self):\n        pass\n\n    def long(self):\n"
    source += "\n".join("    " + line for line in body.splitlines())
    assert long_functions(source, "m.py") == ["m.py:2 long (82 lines)", "m.py:88 long (81 lines)"]
    assert long_functions(source, "m.py", limit=82) == []  # a function of exactly the limit is fine
