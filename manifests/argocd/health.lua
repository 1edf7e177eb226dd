-- Argo CD health check for kvscale.io/LLMEndpoint, read from the kstatus conditions the operator
-- writes: Stalled (abnormal-true: stuck) or Degraded -> Degraded; a spec the operator has not yet
-- observed, or Reconciling (abnormal-true: converging) -> Progressing; Ready -> Healthy.
local hs = {}

local function describe(condition)
  local text = condition.reason or condition.type
  if condition.message ~= nil and condition.message ~= "" then
    text = text .. ": " .. condition.message
  end
  return text
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kvscale operator to report status"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the kvscale operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = {}
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    conditions[condition.type] = condition
  end
end

local function is_true(type)
  return conditions[type] ~= nil and conditions[type].status == "True"
end

if is_true("Stalled") then
  hs.status = "Degraded"
  hs.message = describe(conditions["Stalled"])
  return hs
end
if is_true("Degraded") then
  hs.status = "Degraded"
  hs.message = describe(conditions["Degraded"])
  return hs
end
if is_true("Reconciling") then
  hs.status = "Progressing"
  hs.message = describe(conditions["Reconciling"])
  return hs
end
if is_true("Ready") then
  hs.status = "Healthy"
  hs.message = describe(conditions["Ready"])
  return hs
end

hs.status = "Progressing"
if conditions["Ready"] ~= nil then
  hs.message = describe(conditions["Ready"])
else
  hs.message = "Waiting for the Ready condition"
end
return hs
