-- Argo CD health of a glm-operator GLMService (serving.glm-operator.dev/v1alpha2).
-- Base and table libraries only: it runs the same from argocd-cm (standard libraries closed)
-- and as a built-in script.
local hs = {}

local function condition(status, type)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

-- The first argument that is a non-empty string (arguments may be nil).
local function first_message(...)
  for i = 1, select("#", ...) do
    local m = select(i, ...)
    if m ~= nil and m ~= "" then
      return m
    end
  end
  return ""
end

local function message(c)
  if c == nil then
    return nil
  end
  return c.message
end

local metadata = obj.metadata or {}
local spec = obj.spec or {}
local status = obj.status or {}

-- Conditions describe an older spec until the operator has seen this one.
if metadata.generation ~= nil and
    (status.observedGeneration == nil or status.observedGeneration < metadata.generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe generation " .. metadata.generation
  return hs
end

local rollout = status.rollout
if rollout ~= nil then
  if rollout.phase == "Paused" then
    hs.status = "Suspended"
    hs.message = first_message(rollout.message,
      "rollout to " .. tostring(rollout.modelVersion) .. " is paused")
    return hs
  end
  -- A rollout that failed for the version git still asks for: the operator serves the old
  -- version again, and git points at the failed one until someone reverts the commit.
  local failed = { RolledBack = true, Aborted = true, Failed = true }
  if failed[rollout.phase] and rollout.modelVersion == spec.modelVersion then
    hs.status = "Degraded"
    hs.message = first_message(rollout.message,
      message(condition(status, "CanaryProgressing")),
      message(condition(status, "Progressing")),
      "rollout to " .. tostring(rollout.modelVersion) .. " " .. rollout.phase)
    return hs
  end
end

-- Reasons that waiting cannot fix: the spec (or its ModelVersion) has to change. Planned and
-- ModelReady describe the spec as it is now, so they count even while pods of an earlier
-- spec still serve (Ready=True).
local permanent = {
  Infeasible = true,
  ModelFactsUnknown = true,
  InvalidPlanInput = true,
  EngineFormatMismatch = true,
  CacheNotShareable = true,
  NoImageForNodeArchitecture = true,
  ModelVersionInvalid = true,
  ModelVersionFailed = true,
}
for _, type in ipairs({ "Ready", "ModelReady", "Planned" }) do
  local c = condition(status, type)
  if c ~= nil and c.status == "False" and permanent[c.reason] then
    hs.status = "Degraded"
    hs.message = first_message(c.message, c.reason)
    return hs
  end
end

local ready = condition(status, "Ready")

local degraded = condition(status, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = first_message(degraded.message, degraded.reason)
  return hs
end

local progressing = condition(status, "Progressing")
if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = first_message(progressing.message, progressing.reason)
  return hs
end

if ready == nil or ready.status ~= "True" then
  hs.status = "Progressing"
  hs.message = first_message(message(ready), "waiting for the Ready condition")
  return hs
end

hs.status = "Healthy"
hs.message = first_message(ready.message)
return hs
