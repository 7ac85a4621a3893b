#!/bin/bash
set -e
greet "$(cat name.txt)" > greeting.txt
