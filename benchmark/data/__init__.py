"""The inputs of a run: the task suite, corpora packed into chunks, masking, end-task data, the training stream,
and the offline synthetic world and base models. Nothing here trains or scores a method."""
