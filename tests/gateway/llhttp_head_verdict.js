// llhttp's verdict on response heads, through Node's public `http` client (Node parses with
// llhttp, strict unless `insecureHTTPParser` is set, and it is not here).
//
// stdin: a JSON list of base64 strings, each the bytes of a whole response (head and body).
// Each is answered, then the connection closed, to a `GET /` on its own connection.
// stdout: a JSON object, {node, llhttp, verdicts}, one verdict a response, in order:
// {verdict: "accept", body} (base64 of the body llhttp handed out, the connection's end
// ending it where the head gave no length) or {verdict: "refuse", code} (llhttp's error
// code, or "aborted" where the connection ended inside a body). Bytes after a complete body
// are another response to llhttp, refused: the tests send none. Responses go 32 at a time.
// Used by tests/gateway/test_response_head.py.
"use strict";

const http = require("http");
const net = require("net");

async function main() {
  const answers = JSON.parse(require("fs").readFileSync(0, "utf8"));
  let next = 0;
  const order = [];
  const server = net.createServer((socket) => {
    let id;
    socket.on("data", (data) => {
      if (id !== undefined) return;
      id = Number(/x-id: (\d+)/i.exec(data.toString("latin1"))[1]);
      socket.end(Buffer.from(answers[id], "base64"));
    });
    socket.on("error", () => {});
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = server.address().port;
  const agent = new http.Agent({ keepAlive: false });

  const one = (id) => new Promise((resolve) => {
    let settled = false;
    const settle = (verdict) => { if (!settled) { settled = true; resolve(verdict); } };
    const parts = [];
    const req = http.get({ host: "127.0.0.1", port, path: "/", agent, headers: { "x-id": id },
                           insecureHTTPParser: false }, (res) => {
      res.on("data", (d) => parts.push(d));
      res.on("end", () => settle(res.complete
        ? { verdict: "accept", body: Buffer.concat(parts).toString("base64") }
        : { verdict: "refuse", code: "aborted" }));
      res.on("aborted", () => settle({ verdict: "refuse", code: "aborted" }));
      res.on("error", (err) => settle({ verdict: "refuse", code: err.code || "aborted" }));
    });
    req.on("error", (err) => settle({ verdict: "refuse", code: err.code || String(err) }));
  });
  const verdicts = [];
  const batch = 32;
  for (let start = 0; start < answers.length; start += batch) {
    const ids = [];
    for (let id = start; id < Math.min(answers.length, start + batch); id++) ids.push(id);
    verdicts.push(...await Promise.all(ids.map(one)));
  }
  server.close();
  process.stdout.write(JSON.stringify({
    node: process.version, llhttp: process.versions.llhttp, verdicts,
  }), () => process.exit(0));
}

main().catch((err) => { console.error(err); process.exit(1); });
