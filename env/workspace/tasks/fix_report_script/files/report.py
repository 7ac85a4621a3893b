"""Latency report: median latency (ms) per endpoint from latency.csv, written to outputs/answer.json."""

import csv
import json
import os
from collections import defaultdict


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (float(ordered[mid - 1]) + float(ordered[mid])) / 2


def main():
    latencies = defaultdict(list)
    with open("latency.csv", newline="") as f:
        for row in csv.DictReader(f):
            latencies[row["endpoint"]].append(row["latency_ms"])
    medians = {endpoint: median(values) for endpoint, values in latencies.items()}
    report = {
        "median_ms": medians,
        "slowest_endpoint": max(medians, key=medians.get),
    }
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/answer.json", "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
