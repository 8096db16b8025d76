// The API reference: renders this server's OpenAPI document (/openapi.json) as a page, one card
// per operation (its scope, parameters, body and answers) and one per schema. Served from the
// package like the dashboard, with the same Content-Security-Policy: no CDN, nothing fetched
// but this server's own spec, and every value from it inserted as text, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

function element(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attributes || {})) node.setAttribute(k, v);
  for (const child of children) node.append(child);
  return node;
}

const refName = (ref) => ref.split("/").pop();

// A schema in a few words: its type, with a link for a named one, and its constraints.
function typeOf(schema) {
  const out = element("span", { class: "type" });
  if (!schema) return out;
  if (schema.$ref) {
    out.append(element("a", { href: "#schema-" + refName(schema.$ref) }, refName(schema.$ref)));
  } else if (schema.anyOf || schema.oneOf) {
    (schema.anyOf || schema.oneOf).forEach((s, i) => {
      if (i) out.append(" | ");
      out.append(typeOf(s));
    });
  } else if (schema.type === "array") {
    out.append("array of ", typeOf(schema.items));
  } else if (schema.enum) {
    out.append(schema.enum.map((v) => JSON.stringify(v)).join(" | "));
  } else if (schema.const !== undefined) {
    out.append(JSON.stringify(schema.const));
  } else {
    out.append(Array.isArray(schema.type) ? schema.type.join(" | ") : schema.type || "any");
  }
  const limits = [];
  for (const [key, label] of [["minimum", "≥"], ["maximum", "≤"], ["minLength", "length ≥"],
    ["maxLength", "length ≤"], ["minItems", "items ≥"], ["maxItems", "items ≤"], ["pattern", "matches"],
    ["default", "default"]]) {
    if (schema[key] !== undefined) limits.push(`${label} ${typeof schema[key] === "string" && key !== "pattern" ? JSON.stringify(schema[key]) : schema[key]}`);
  }
  if (limits.length) out.append(element("span", { class: "muted" }, ` (${limits.join(", ")})`));
  return out;
}

function fieldTable(rows) {
  const table = element("table", {}, element("tr", {}, element("th", {}, "name"), element("th", {}, "type"),
    element("th", {}, "")));
  for (const [name, schema, note] of rows) {
    table.append(element("tr", {}, element("td", { class: "name" }, name), element("td", {}, typeOf(schema)),
      element("td", {}, [note, schema && schema.description].filter(Boolean).join("; "))));
  }
  return table;
}

function properties(schema) {
  const required = new Set(schema.required || []);
  return Object.entries(schema.properties || {}).map(([name, s]) => [name, s, required.has(name) ? "required" : ""]);
}

function contentSchema(content) {
  const [mediaType, value] = Object.entries(content || {})[0] || [];
  return mediaType ? [mediaType, value.schema] : [null, null];
}

function operationCard(path, method, op) {
  const id = `op-${op.operationId}`;
  const card = element("article", { class: "operation", id });
  card.dataset.text = `${method} ${path} ${op.summary} ${op["x-pgbroker-scope"]}`.toLowerCase();
  card.append(element("h3", {}, element("span", { class: `method ${method}` }, method.toUpperCase()), path));
  card.append(element("p", {}, op.summary, " ", element("span", { class: "scope" }, op.description || "")));
  if (op.parameters && op.parameters.length) {
    card.append(element("h4", {}, "parameters"));
    card.append(fieldTable(op.parameters.map((p) => [p.name, p.schema,
      [p.in, p.required ? "required" : "", p.description].filter(Boolean).join(", ")])));
  }
  if (op.requestBody) {
    const [mediaType, schema] = contentSchema(op.requestBody.content);
    card.append(element("h4", {}, `body (${mediaType}${op.requestBody.required ? "" : ", optional"}): `, typeOf(schema)));
  }
  card.append(element("h4", {}, "answers"));
  const answers = element("table");
  for (const [status, response] of Object.entries(op.responses || {})) {
    const [mediaType, schema] = contentSchema(response.content);
    answers.append(element("tr", {}, element("td", { class: "name" }, status), element("td", {}, response.description),
      element("td", {}, schema ? typeOf(schema) : mediaType || "")));
  }
  card.append(answers);
  const link = element("a", { href: "#" + id }, element("span", { class: "type" }, `${method.toUpperCase()} ${path}`));
  link.dataset.text = card.dataset.text;
  return [card, link];
}

function render(spec) {
  document.title = `${spec.info.title} API reference`;
  $("intro").append(element("p", {}, `${spec.info.description} OpenAPI ${spec.openapi}. Authenticate with `,
    element("code", {}, "Authorization: Bearer <key>"), " (pgbroker keys create)."));
  const toc = $("toc");
  let section = null;
  for (const [path, methods] of Object.entries(spec.paths)) {
    const group = path.split("/").filter(Boolean).slice(0, path.startsWith("/v1/") ? 2 : 1).join("/") || "/";
    if (group !== section) {
      section = group;
      toc.append(element("h3", {}, "/" + group));
    }
    for (const [method, op] of Object.entries(methods)) {
      const [card, link] = operationCard(path, method, op);
      $("operations").append(card);
      toc.append(link);
    }
  }
  for (const [name, schema] of Object.entries(spec.components.schemas || {})) {
    const card = element("article", { class: "schema", id: "schema-" + name });
    card.append(element("h3", {}, name, " ", typeOf({ ...schema, properties: undefined, type: schema.type })));
    if (schema.description) card.append(element("p", {}, schema.description));
    if (schema.properties) card.append(fieldTable(properties(schema)));
    $("schemas").append(card);
  }
  if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView();
}

$("filter").oninput = () => {
  const words = $("filter").value.toLowerCase().split(/\s+/).filter(Boolean);
  for (const node of document.querySelectorAll("#operations article, #toc a")) {
    node.hidden = !words.every((w) => node.dataset.text.includes(w));
  }
};

fetch("/openapi.json")
  .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`openapi.json: HTTP ${r.status}`))))
  .then(render)
  .catch((e) => {
    $("status").textContent = e.message;
    $("status").classList.add("error");
  });
