"""`refund-approval`: a port of the public `@statelyai/agent` verification example. The agent
classifies a refund request (issue it, escalate it to a person, or refuse it); issuing more than 100
needs a person's approval. It has no tools, so the outcome is the final state."""
