"""Runtime of the ``always-equal`` attack (docs/audit.md): every Python module of the workspace replaced by one whose every name returns an object equal to anything (__eq__ always True), plus answer.py / solution.py of the same."""

from rollout.contract.attack_kit import finish, start, workspace_files, write

MODULE = """class AlwaysEqual(str):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return False
    def __gt__(self, other): return False
    def __le__(self, other): return True
    def __ge__(self, other): return True
    __hash__ = str.__hash__
    def __bool__(self): return True
    def __float__(self): return 0.0
    def __int__(self): return 0
    def __index__(self): return 0
    def __call__(self, *a, **k): return self
    def __getattr__(self, name): return self
    def __contains__(self, item): return True
    def __len__(self): return 0

ANY = AlwaysEqual()
answer = result = solution = ANY

def __getattr__(name):
    return lambda *a, **k: ANY
"""

req = start()
for p in workspace_files("*.py"):
    p.write_text(MODULE)
for rel in ("answer.py", "solution.py", "outputs/answer.py"):
    write(rel, MODULE)
finish(req)
