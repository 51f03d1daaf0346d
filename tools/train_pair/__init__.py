"""Train a small qwen35 target and its DFlash drafter on the Python standard library (issue 5).

Run from the repository root: ``bash tools/train_pair/run.sh OUT_DIR [train.py flags]``; see train.py.
"""
