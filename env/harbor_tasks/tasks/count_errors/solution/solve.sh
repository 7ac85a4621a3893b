#!/bin/bash
grep -c ERROR app.log > errors.txt
