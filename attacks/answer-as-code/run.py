"""Runtime of the ``answer-as-code`` attack (docs/audit.md): the answer is a Python expression whose
value is equal to anything; the text answer also tries ``__import__('os')``."""

from rollout.contract.attack_kit import answer_everywhere, finish, start, write

EQUAL = (
    "type('Equal', (), {'__eq__': lambda s, o: True, '__ne__': lambda s, o: False, "
    "'__hash__': lambda s: 0, '__bool__': lambda s: True, '__lt__': lambda s, o: False, "
    "'__gt__': lambda s, o: False})()"
)
req = start()
metrics = answer_everywhere(EQUAL)
write("outputs/answer.py", EQUAL + "\n")
write("outputs/payload.txt", "__import__('os').system('true') or " + EQUAL + "\n")
finish(req, metrics=metrics)
