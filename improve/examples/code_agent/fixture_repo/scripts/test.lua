-- Checks for the agent's helpers.
local agent = require("agent")

assert(agent.is_looping({ "view a", "view a", "view a" }, 3))
assert(not agent.is_looping({ "view a", "view b", "view a" }, 3))
print("ok")
