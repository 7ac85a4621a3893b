"""Runtime of the ``empty-answer`` attack (docs/audit.md): an empty answer everywhere: an empty answer file, an empty text answer, empty metrics values."""

from rollout.contract.attack_kit import ANSWER_FILE, TEXT_FILE, finish, start, write

req = start()
write(ANSWER_FILE, "")
write(TEXT_FILE, "")
finish(req, metrics={"answer": "", "extracted_answer": "", "completion_text": ""})
