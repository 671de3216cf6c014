#!/bin/sh
# The runner: TEST_DIR is where the tests are.
sh "$TEST_DIR/test_answer.sh"
