"""Hostile call strings for the BFCL multi-turn verifier (and the agent loop that decodes them).

``call_corpus()`` returns a deterministic list of strings in the place of BFCL call strings: code that
must never run (imports, builtins, dunder walks, attribute chains, lambdas, comprehensions), calls of real
backend methods with absurd but literal arguments, unknown functions, broken syntax, huge and deeply nested
literals, binary and unicode noise. None may crash the verifier, run outside BFCL's backends, or take
long; pathological *compute* through a real method (``power`` of two huge integers) is left to the time
limit's own test.
"""

from __future__ import annotations

import random


def _code() -> list[str]:
    """Code that a naive ``eval`` would run."""
    return [
        "__import__('os').system('touch PWNED')",
        "open('PWNED', 'w')",
        "open(file='PWNED', mode='w')",
        "exec('open(\"PWNED\", \"w\")')",
        "eval('1+1')",
        "compile('1', 'x', 'eval')",
        "globals()",
        "locals()",
        "vars()",
        "breakpoint()",
        "exit()",
        "quit()",
        "input()",
        "print('hi')",
        "getattr(__builtins__, 'open')('PWNED', 'w')",
        "().__class__.__base__.__subclasses__()",
        "[].__class__.__mro__[1].__subclasses__()",
        "cd.__globals__",
        "cd.__func__.__globals__['__builtins__']",
        "ls.__self__.__dict__",
        "type('x', (), {})()",
        "(lambda: __import__('os'))()",
        "[x for x in ().__class__.__bases__[0].__subclasses__()]",
        "cd(folder=__import__('os').getcwd())",
        "cd(folder=open('/etc/passwd').read())",
        "cd(folder=(lambda: 'x')())",
        "cd(folder=[c for c in 'abc'])",
        "cd(folder=f'{1+1}')",
        "cd(folder=(x := 'a'))",
        "cd(folder='a' + 'b')",
        "cd(folder='a' * 10)",
        "cd(*['a'])",
        "cd(**{'folder': 'a'})",
        "cd(folder=x)",
        "cd(folder=None.__class__)",
        "os.system('touch PWNED')",
        "subprocess.run(['touch', 'PWNED'])",
        "re.compile('a')",
        "json.loads('1')",
        "copy.deepcopy(1)",
        "importlib.import_module('os')",
        "inspect.stack()",
        "execute_multi_turn_func_call([], {}, [], 'x', 'y')",
        "_process_method_calls('a', {})",
        "GorillaFileSystem()",
        "cd(folder='a'); import os",
        "cd(folder='a')\nimport os",
        "ls() or __import__('os')",
        "ls() if 1 else exit()",
        "await ls()",
        "yield ls()",
        "cd(folder='a')(1)",
        "cd(folder='a')[0]",
        "cd(folder='a').upper()",
    ]


def _literals() -> list[str]:
    """Real backend methods with absurd but literal arguments, unknown functions."""
    return [
        "cd(folder='" + "a" * 9_000 + "')",
        "cd(folder='" + "a" * 20_000 + "')",
        "mkdir(dir_name=" + "9" * 4_000 + ")",
        "mkdir(dir_name=" + "9" * 5_000 + ")",
        "mkdir(dir_name=1e999999)",
        "mkdir(dir_name=-1e999999)",
        "mkdir(dir_name=float('nan'))",
        "echo(content=" + "[" * 200 + "]" * 200 + ", file_name='x')",
        "echo(content=" + "[" * 5_000 + "]" * 5_000 + ", file_name='x')",
        "echo(content={'a': {'b': {'c': [1, (2, {3})]}}}, file_name='x')",
        "echo(content=b'\\x00\\xff', file_name='x')",
        "echo(content='\\x00', file_name='\\u202e')",
        "cd(folder=None)",
        "cd(folder=True)",
        "cd(folder=...)",
        "cd(folder=1j)",
        "cd()",
        "cd(1, 2, 3)",
        "cd(folder='a', folder='b')",
        "cd(nonexistent='a')",
        "ls(a=True, b=False, c=None)",
        "nonexistent_function(x=1)",
        "kill(pid=1)",
        "rm(file_name='/')",
        "rm(file_name='..')",
        "mv(source='..', destination='/')",
        "_load_scenario(scenario={})",
        "__init__()",
        "mrtpo_refused_call()",
        "Cd(folder='a')",
        "cd (folder='a')",
        "  cd(folder='a')  ",
        "\tcd(folder='a')",
    ]


def _broken() -> list[str]:
    return [
        "", " ", "\n", "()", "cd", "cd(", "cd(folder='a'", "cd(folder='a'))", "cd(folder='a',,)", "cd(folder=)",
        "cd(=1)", "cd('a' folder='b')", "[cd(folder='a')]", "cd(folder='a'), ls()", "{'name': 'cd'}",
        '{"name": "cd", "arguments": {"folder": "a"}}', "<tool_call>cd(folder='a')</tool_call>", "None", "1",
        "'cd()'", "\x00", "cd(folder='\x00')", "cd(folder='\ud800')", "\ud800()", "ｃｄ(folder='a')",
        "cd(folder='a')" * 1_000, "(" * 10_000, ")" * 10_000, "cd(" + "(" * 300 + ")" * 300 + ")",
        "#cd(folder='a')", "cd(folder='a') # comment", "\\", "cd(folder='a')\\", "lambda: 1",
    ]


def _noise(n: int = 40) -> list[str]:
    rng = random.Random(20261202)
    out = []
    for i in range(n):
        k = rng.choice([1, 8, 64, 512])
        if i % 3 == 0:
            out.append("".join(chr(rng.randrange(0, 0x110000)) for _ in range(k)))
        elif i % 3 == 1:
            out.append(bytes(rng.randrange(256) for _ in range(k)).decode("latin-1"))
        else:
            out.append("cd(folder=" + repr("".join(chr(rng.randrange(32, 0x3000)) for _ in range(k))) + ")")
    return out


def call_corpus() -> list[str]:
    """The whole corpus, deterministic."""
    return [*_code(), *_literals(), *_broken(), *_noise()]
