"""A small, safe evaluator for a subset of CEL (Common Expression Language).

Why not a CEL package from PyPI (bench/cel_bench.py, docs/configuration.md
"[[rules]]"): Debian 13 packages neither `cel-python` nor
`common-expression-language`; the first is slow (hundreds of µs a rule) and
brings lark, pendulum, google-re2, jmespath and pyyaml into a root daemon, the
second is a compiled Rust extension Debian would have to build from its
crates; neither documents a limit on one evaluation's cost. A rule here only
needs comparisons, boolean logic, string tests and field access, so this
module parses that subset once (at config load) into nested closures and runs
them with a step budget.

The subset: literals (int, string, true, false, null, [lists]); names;
`a.b` and `a["b"]` (maps) and `a[0]` (lists); `! -` `* / %` `+ -`
`== != < <= > >= in` `&&` `||` `c ? x : y`; functions `size(x)`, `rank(level)`
and the methods `s.startsWith(t)`, `s.endsWith(t)`, `s.contains(t)`,
`s.lower()`, `s.glob(pattern)`, `x.size()`. No macros, no loops, no regular
expressions (Python's re has no bound on backtracking), nothing that reaches
outside the values it is given.

Bounds: the source text, the nesting depth and the number of nodes are
limited at compile time (a bad or oversized rule is refused at load with
its column); every evaluation has a step budget in which each node costs one
step and each string it builds costs one step per 64 characters.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

MAX_SOURCE = 4096
MAX_DEPTH = 32
MAX_NODES = 512
MAX_STEPS = 20_000
MAX_STRING = 1 << 20  # no rule builds a string longer than this

LEVELS = ("public", "internal", "private")


class CelError(Exception):
    """A compile error (with a 1-based column) or a run-time error."""

    def __init__(self, message: str, column: int = 0) -> None:
        super().__init__(f"col {column}: {message}" if column else message)
        self.column = column
        self.reason = message


# ------------------------------------------------------------------ lexer

_PUNCT = ("&&", "||", "==", "!=", "<=", ">=", "(", ")", "[", "]", ".", ",", "?", ":",
          "!", "-", "+", "*", "/", "%", "<", ">")
_KEYWORDS = {"true": True, "false": False, "null": None}
_RESERVED = frozenset({"as", "break", "const", "continue", "else", "for", "function", "if",
                       "import", "let", "loop", "package", "namespace", "return", "var",
                       "void", "while"})
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


@dataclass(frozen=True)
class _Tok:
    kind: str  # int, str, name, op, end
    value: Any
    col: int


def _lex(src: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        col = i + 1
        if c in " \t\r\n":
            i += 1
            continue
        if c.isascii() and (c.isalpha() or c == "_"):
            j = i + 1
            while j < n and src[j].isascii() and (src[j].isalnum() or src[j] == "_"):
                j += 1
            word = src[i:j]
            if word in _RESERVED:
                raise CelError(f"{word!r} is a reserved word", col)
            toks.append(_Tok("lit", _KEYWORDS[word], col) if word in _KEYWORDS
                        else _Tok("name", word, col))
            i = j
            continue
        if c.isdigit():
            j = i
            while j < n and src[j].isdigit():
                j += 1
            if j - i > 18:
                raise CelError("integer literal too long", col)
            toks.append(_Tok("lit", int(src[i:j]), col))
            i = j
            continue
        if c in "\"'":
            j, out = i + 1, []
            while True:
                if j >= n or src[j] == "\n":
                    raise CelError("unterminated string", col)
                ch = src[j]
                if ch == c:
                    break
                if ch == "\\":
                    if j + 1 >= n or src[j + 1] not in _ESCAPES:
                        raise CelError("unknown escape in string", j + 1)
                    out.append(_ESCAPES[src[j + 1]])
                    j += 2
                    continue
                out.append(ch)
                j += 1
            toks.append(_Tok("lit", "".join(out), col))
            i = j + 1
            continue
        for p in _PUNCT:
            if src.startswith(p, i):
                toks.append(_Tok("op", p, col))
                i += len(p)
                break
        else:
            raise CelError(f"unexpected character {c!r}", col)
    toks.append(_Tok("end", None, n + 1))
    return toks


# ------------------------------------------------------------------ tree

# A node is a tuple: (op, col, *children). Plain tuples keep evaluation fast.
Node = tuple[Any, ...]

_METHODS = {"startsWith": 1, "endsWith": 1, "contains": 1, "lower": 0, "glob": 1, "size": 0}
_FUNCTIONS = {"size": 1, "rank": 1}


class _Parser:
    def __init__(self, src: str) -> None:
        self.toks = _lex(src)
        self.i = 0
        self.depth = 0
        self.nodes = 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def accept(self, op: str) -> bool:
        t = self.peek()
        if t.kind == "op" and t.value == op:
            self.i += 1
            return True
        return False

    def expect(self, op: str) -> None:
        if not self.accept(op):
            t = self.peek()
            got = "the end" if t.kind == "end" else repr(t.value)
            raise CelError(f"expected {op!r}, found {got}", t.col)

    def node(self, *parts: Any) -> Node:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise CelError(f"expression too large (more than {MAX_NODES} nodes)", parts[1])
        return parts

    def enter(self, col: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CelError(f"expression nested too deeply (more than {MAX_DEPTH} levels)", col)

    def parse(self) -> Node:
        tree = self.expr()
        t = self.peek()
        if t.kind != "end":
            raise CelError(f"unexpected {t.value!r}", t.col)
        return tree

    def expr(self) -> Node:
        col = self.peek().col
        self.enter(col)
        cond = self.binary(0)
        if self.accept("?"):
            yes = self.expr()
            self.expect(":")
            no = self.expr()
            cond = self.node("?:", col, cond, yes, no)
        self.depth -= 1
        return cond

    _LEVELS: tuple[tuple[str, ...], ...] = (
        ("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"), ("+", "-"), ("*", "/", "%"),
    )

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        ops = self._LEVELS[level]
        while True:
            t = self.peek()
            op = t.value if t.kind in ("op", "name") else None
            if op not in ops:
                return left
            self.i += 1
            right = self.binary(level + 1)
            left = self.node(op, t.col, left, right)
        # unreachable

    def unary(self) -> Node:
        t = self.peek()
        if t.kind == "op" and t.value in ("!", "-"):
            self.i += 1
            self.enter(t.col)
            operand = self.unary()
            self.depth -= 1
            return self.node("neg" if t.value == "-" else "!", t.col, operand)
        return self.member()

    def member(self) -> Node:
        tree = self.primary()
        while True:
            t = self.peek()
            if self.accept("."):
                name = self.take()
                if name.kind != "name":
                    raise CelError("expected a field or method name after '.'", name.col)
                if self.accept("("):
                    args = self.args(")")
                    want = _METHODS.get(name.value)
                    if want is None:
                        raise CelError(f"unknown method {name.value!r}", name.col)
                    if len(args) != want:
                        raise CelError(f"{name.value}() takes {want} argument(s)", name.col)
                    if name.value == "glob" and not (args[0][0] == "lit"
                                                     and isinstance(args[0][2], str)):
                        # The pattern is the rule writer's, never the agent's:
                        # a pattern becomes a cached regex.
                        raise CelError("glob() takes a string literal", name.col)
                    tree = self.node("call", name.col, name.value, tree, *args)
                else:
                    tree = self.node("field", name.col, tree, name.value)
            elif self.accept("["):
                self.enter(t.col)
                key = self.expr()
                self.depth -= 1
                self.expect("]")
                tree = self.node("index", t.col, tree, key)
            else:
                return tree

    def args(self, close: str) -> list[Node]:
        out: list[Node] = []
        if self.accept(close):
            return out
        while True:
            out.append(self.expr())
            if self.accept(close):
                return out
            self.expect(",")

    def primary(self) -> Node:
        t = self.take()
        if t.kind == "lit":
            return self.node("lit", t.col, t.value)
        if t.kind == "name":
            if self.accept("("):
                want = _FUNCTIONS.get(t.value)
                if want is None:
                    raise CelError(f"unknown function {t.value!r}", t.col)
                args = self.args(")")
                if len(args) != want:
                    raise CelError(f"{t.value}() takes {want} argument(s)", t.col)
                return self.node("fn", t.col, t.value, *args)
            return self.node("var", t.col, t.value)
        if t.kind == "op" and t.value == "(":
            inner = self.expr()
            self.expect(")")
            return inner
        if t.kind == "op" and t.value == "[":
            self.enter(t.col)
            items = self.args("]")
            self.depth -= 1
            return self.node("list", t.col, *items)
        got = "end of expression" if t.kind == "end" else repr(t.value)
        raise CelError(f"unexpected {got}", t.col)


# ------------------------------------------------------------------ program


class Spent(Protocol):
    left: int



@dataclass(frozen=True)
class Program:
    source: str
    tree: Node
    names: frozenset[str]
    nodes: int
    fn: Fn

    def evaluate(self, env: Mapping[str, Any], *, max_steps: int = MAX_STEPS,
                 spent: Spent | None = None) -> Any:
        """`spent`: a caller's running total (its `left` is lowered by the
        steps this evaluation took, also when it fails)."""
        budget = _Budget(max_steps)
        try:
            budget.cost(self.nodes)
            return self.fn(env, budget)
        finally:
            if spent is not None:
                spent.left -= max_steps - budget.left


def compile_expr(source: str, names: Sequence[str] = ()) -> Program:
    """Parse once; raises CelError with a column. `names`: when given, the
    only variables the expression may use (a typo is a load error, not a
    deny at run time)."""
    if len(source) > MAX_SOURCE:
        raise CelError(f"expression longer than {MAX_SOURCE} characters", MAX_SOURCE)
    parser = _Parser(source)
    tree = parser.parse()
    # A chain `a && b && c ...` is shallow to parse but as deep as a nest to
    # walk: the tree's own depth is what evaluation recurses on.
    if (depth := _depth(tree)) > MAX_DEPTH * 2:
        raise CelError(f"expression nested too deeply ({depth} levels, at most {MAX_DEPTH * 2})",
                       1)
    used = _names(tree)
    if names:
        for name, col in used:
            if name not in names:
                raise CelError(f"unknown variable {name!r}; known: {', '.join(names)}", col)
    return Program(source, tree, frozenset(n for n, _ in used), parser.nodes, _build(tree))


def _depth(tree: Node) -> int:
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in node[2:] if isinstance(c, tuple))
    return deepest


def _names(tree: Node) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if node[0] == "var":
            out.append((node[2], node[1]))
        elif node[0] != "lit":
            stack.extend(c for c in node[2:] if isinstance(c, tuple))
    return sorted(out, key=lambda x: x[1])


def _type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, str):
        return "string"
    if isinstance(v, Mapping):
        return "map"
    if isinstance(v, (list, tuple)):
        return "list"
    return type(v).__name__


class _Budget:
    """Steps left for one evaluation. Every node runs at most once (no loops),
    so nodes are charged up front; what varies with the input (strings, the
    lists `in` scans) is charged as it is met."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def cost(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise CelError("evaluation ran over its step budget")

    def string(self, v: Any) -> Any:
        if type(v) is str and len(v) >= 64:
            if len(v) > MAX_STRING:
                raise CelError(f"string longer than {MAX_STRING} characters")
            self.cost(len(v) >> 6)
        return v


Fn = Callable[[Mapping[str, Any], _Budget], Any]


def _build(node: Node) -> Fn:
    """The tree as nested closures: one Python call per node, no dispatch."""
    op, col = node[0], node[1]
    if op == "lit":
        value = node[2]
        return lambda env, b: value
    if op == "var":
        name = node[2]

        def var(env: Mapping[str, Any], b: _Budget) -> Any:
            try:
                return env[name]
            except KeyError:
                raise CelError(f"no variable {name!r}", col) from None
        return var
    if op == "field":
        inner = node[2]
        if inner[0] == "var":
            return _var_field(inner[2], node[3], col)
        return _field(_build(inner), node[3], col)
    if op in ("&&", "||"):
        return _logic(op, _build(node[2]), _build(node[3]), col)
    if op == "?:":
        cond, yes, no = _build(node[2]), _build(node[3]), _build(node[4])

        def choose(env: Mapping[str, Any], b: _Budget) -> Any:
            c = cond(env, b)
            if not isinstance(c, bool):
                raise CelError(f"condition is {_type(c)}, not bool", col)
            return yes(env, b) if c else no(env, b)
        return choose
    if op == "!":
        inner = _build(node[2])

        def negate(env: Mapping[str, Any], b: _Budget) -> Any:
            v = inner(env, b)
            if not isinstance(v, bool):
                raise CelError(f"'!' needs a bool, not {_type(v)}", col)
            return not v
        return negate
    if op == "neg":
        inner = _build(node[2])

        def minus(env: Mapping[str, Any], b: _Budget) -> Any:
            v = inner(env, b)
            if isinstance(v, bool) or not isinstance(v, int):
                raise CelError(f"'-' needs an int, not {_type(v)}", col)
            return -v
        return minus
    if op == "index":
        base, key = _build(node[2]), _build(node[3])
        return lambda env, b: _index(base(env, b), key(env, b), col)
    if op == "list":
        items = [_build(c) for c in node[2:]]
        return lambda env, b: tuple(f(env, b) for f in items)
    if op == "call" and name_is_str_test(node):
        return _str_test(node[2], _build(node[3]), node[4][2], col)
    if op == "call":
        name, recv = node[2], _build(node[3])
        args = [_build(c) for c in node[4:]]
        return lambda env, b: _method(name, recv(env, b), [f(env, b) for f in args], col, b)
    if op == "fn":
        name, arg = node[2], _build(node[3])
        return lambda env, b: _function(name, arg(env, b), col)
    if op in ("==", "!=") and node[3][0] == "lit":
        lit, lit_type, side = node[3][2], _type(node[3][2]), _build(node[2])
        if op == "==":
            return lambda env, b: _equal_lit(side(env, b), lit, lit_type)
        return lambda env, b: not _equal_lit(side(env, b), lit, lit_type)
    left, right = _build(node[2]), _build(node[3])
    if op == "==":
        return lambda env, b: _equal(left(env, b), right(env, b))
    if op == "!=":
        return lambda env, b: not _equal(left(env, b), right(env, b))
    return lambda env, b: _binop(op, left(env, b), right(env, b), col, b)


def _var_field(var: str, name: str, col: int) -> Fn:
    def field(env: Mapping[str, Any], b: _Budget) -> Any:
        try:
            v = env[var]
        except KeyError:
            raise CelError(f"no variable {var!r}", col) from None
        if type(v) is dict:
            try:
                return v[name]
            except KeyError:
                raise CelError(f"no such key {name!r}", col) from None
        return _get(v, name, col)
    return field


def _get(v: Any, name: str, col: int) -> Any:
    if not isinstance(v, Mapping):
        raise CelError(f"no field {name!r} on {_type(v)}", col)
    try:
        return v[name]
    except KeyError:
        raise CelError(f"no such key {name!r}", col) from None


def _field(base: Fn, name: str, col: int) -> Fn:
    def field(env: Mapping[str, Any], b: _Budget) -> Any:
        v = base(env, b)
        if type(v) is dict:
            try:
                return v[name]
            except KeyError:
                raise CelError(f"no such key {name!r}", col) from None
        if not isinstance(v, Mapping):
            raise CelError(f"no field {name!r} on {_type(v)}", col)
        try:
            return v[name]
        except KeyError:
            raise CelError(f"no such key {name!r}", col) from None
    return field


def _logic(op: str, left: Fn, right: Fn, col: int) -> Fn:
    # CEL's commutative logic: `false && error` and `error && false` are
    # both false; an error stands only when the other side cannot decide.
    short = op == "||"

    def logic(env: Mapping[str, Any], b: _Budget) -> bool:
        try:
            v = left(env, b)
        except CelError:
            return slow(env, b)
        if v is short:
            return op == "||"
        if type(v) is not bool:
            return slow(env, b)
        w = right(env, b)  # left cannot decide: right's value or error stands
        if type(w) is not bool:
            raise CelError(f"{op!r} needs bools, not {_type(w)}", col)
        return bool(w)

    def slow(env: Mapping[str, Any], b: _Budget) -> bool:
        err: CelError | None = None
        for side in (left, right):
            try:
                v = side(env, b)
            except CelError as exc:
                if "step budget" in exc.reason:
                    raise
                err = exc
                continue
            if v is short:
                return op == "||"
            if v is not (not short):
                err = CelError(f"{op!r} needs bools, not {_type(v)}", col)
        if err is not None:
            raise err
        return not short
    return logic


def name_is_str_test(node: Node) -> bool:
    return (node[2] in ("startsWith", "endsWith", "contains") and node[4][0] == "lit"
            and isinstance(node[4][2], str))


def _str_test(name: str, recv: Fn, arg: str, col: int) -> Fn:
    test = {"startsWith": str.startswith, "endsWith": str.endswith,
            "contains": str.__contains__}[name]

    def run(env: Mapping[str, Any], b: _Budget) -> bool:
        r = recv(env, b)
        if type(r) is not str:
            raise CelError(f"{name}() needs a string, not {_type(r)}", col)
        if len(r) >= 64:
            b.string(r)
        return bool(test(r, arg))
    return run


def _equal_lit(a: Any, lit: Any, lit_type: str) -> bool:
    if type(a) is type(lit):
        return bool(a == lit)
    return _type(a) == lit_type and bool(a == lit)


def _equal(a: Any, b: Any) -> bool:
    if type(a) is type(b):
        return bool(a == b)
    return _type(a) == _type(b) and bool(a == b)


def _index(base: Any, key: Any, col: int) -> Any:
    if isinstance(base, Mapping):
        if not isinstance(key, (str, int)):
            raise CelError(f"map key is {_type(key)}, not string or int", col)
        if key not in base:
            raise CelError(f"no such key {key!r}"[:200], col)
        return base[key]
    if isinstance(base, (list, tuple)):
        if isinstance(key, bool) or not isinstance(key, int):
            raise CelError(f"list index is {_type(key)}, not int", col)
        if not 0 <= key < len(base):
            raise CelError(f"index {key} out of range", col)
        return base[key]
    raise CelError(f"cannot index {_type(base)}", col)


def _method(name: str, recv: Any, args: list[Any], col: int, b: _Budget) -> Any:
    if name == "size":
        return _function("size", recv, col)
    if not isinstance(recv, str):
        raise CelError(f"{name}() needs a string, not {_type(recv)}", col)
    b.string(recv)
    if name == "lower":
        return recv.lower()
    arg = args[0]
    if not isinstance(arg, str):
        raise CelError(f"{name}() needs a string argument, not {_type(arg)}", col)
    b.string(arg)
    if name == "startsWith":
        return recv.startswith(arg)
    if name == "endsWith":
        return recv.endswith(arg)
    if name == "contains":
        return arg in recv
    # glob: fnmatch's translation has no nested repeats, so no runaway
    # backtracking; the pattern is bounded like any string here.
    if len(arg) > 1024:
        raise CelError("glob pattern longer than 1024 characters", col)
    return fnmatch.fnmatchcase(recv, arg)


def _function(name: str, arg: Any, col: int) -> Any:
    if name == "size":
        if isinstance(arg, (str, list, tuple, Mapping)):
            return len(arg)
        raise CelError(f"size() of {_type(arg)}", col)
    # rank: the order of a sensitivity level, so rules can compare levels.
    if isinstance(arg, str) and arg in LEVELS:
        return LEVELS.index(arg)
    raise CelError(f"rank() needs one of {', '.join(LEVELS)}", col)


def _binop(op: str, a: Any, b: Any, col: int, budget: _Budget) -> Any:
    ta, tb = _type(a), _type(b)
    if op == "in":
        if isinstance(b, Mapping):
            return a in b if ta in ("string", "int") else False
        if isinstance(b, (list, tuple)):
            budget.cost(len(b))
            return any(_type(x) == ta and x == a for x in b)
        raise CelError(f"'in' needs a list or map, not {tb}", col)
    if ta != tb or ta not in ("int", "string") or (op in ("*", "/", "%", "-")
                                                    and ta != "int"):
        raise CelError(f"no operator {op!r} for {ta} and {tb}", col)
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    if op == ">=":
        return a >= b
    if op == "+":
        if ta == "string":
            if len(a) + len(b) > MAX_STRING:
                raise CelError(f"string longer than {MAX_STRING} characters", col)
            return budget.string(a + b)
        return _int64(a + b, col)
    if op == "-":
        return _int64(a - b, col)
    if op == "*":
        return _int64(a * b, col)
    if b == 0:
        raise CelError("division by zero", col)
    # CEL truncates toward zero, like C.
    q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
    return q if op == "/" else a - q * b


def _int64(v: int, col: int) -> int:
    if not -(1 << 63) <= v < (1 << 63):
        raise CelError("integer overflow", col)
    return v
