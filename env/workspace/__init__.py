"""Workspace env: Harbor/Terminal-Bench style tasks (``tasks/<id>/``) solved by a bash-tool agent
in a temporary workspace and graded on ``outputs/answer.json``."""
