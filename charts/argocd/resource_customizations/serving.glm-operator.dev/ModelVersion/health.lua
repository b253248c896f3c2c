-- Argo CD health of a glm-operator ModelVersion (serving.glm-operator.dev/v1alpha2).
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

local metadata = obj.metadata or {}
local status = obj.status or {}

if metadata.generation ~= nil and
    (status.observedGeneration == nil or status.observedGeneration < metadata.generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe generation " .. metadata.generation
  return hs
end

local ready = condition(status, "Ready")

if status.phase == "Ready" then
  hs.status = "Healthy"
  if ready ~= nil and ready.status == "True" and ready.message ~= nil then
    hs.message = ready.message
  end
  return hs
end

if status.phase == "Failed" then
  -- The fetch Job names the failure in Verified or Cached (reason and message); the
  -- operator's Ready repeats it, or says why the Job failed without reporting.
  hs.status = "Degraded"
  hs.message = "the fetch failed"
  for _, type in ipairs({ "Verified", "Cached", "Ready" }) do
    local c = condition(status, type)
    if c ~= nil and c.status == "False" then
      if c.message ~= nil and c.message ~= "" then
        hs.message = c.message
      else
        hs.message = c.reason
      end
      return hs
    end
  end
  return hs
end

hs.status = "Progressing"
if ready ~= nil and ready.message ~= nil and ready.message ~= "" then
  hs.message = ready.message
else
  hs.message = "phase " .. tostring(status.phase or "Pending")
end
return hs
