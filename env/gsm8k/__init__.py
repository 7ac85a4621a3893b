"""GSM8K env: grade-school math word problems, one model call per case, graded on the final number."""
