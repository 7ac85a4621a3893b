#!/bin/sh
# Tallies votes.csv and writes the winning choice and its vote count.
mkdir -p outputs
tail -n +2 votes.csv | cut -d, -f2 | sort | uniq -c | sort -rn | head -1 |
  awk '{printf "{\"winner\": \"%s\", \"votes\": %d}\n", $2, $1}' > outputs/answer.json
echo "wrote outputs/answer.json"
