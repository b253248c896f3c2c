// llhttp's verdict on chunked bodies, through Node's public `http` module (Node parses with
// llhttp, strict unless `insecureHTTPParser` is set, and it is not here).
//
// stdin: a JSON list of base64 strings, each the bytes of a chunked body. Each is sent on its
// own connection as the body of `POST / HTTP/1.1` with `Transfer-Encoding: chunked`, then the
// connection is half-closed. stdout: a JSON object, {node, llhttp, verdicts}, one verdict a
// body, in order: {verdict: "accept", body} (base64 of the payload llhttp handed out),
// {verdict: "incomplete"} (the connection ended inside the body: llhttp's
// HPE_INVALID_EOF_STATE) or {verdict: "refuse", code} (llhttp's error code). Bodies go 32 at
// a time. Used by tests/gateway/test_chunk_grammar.py.
"use strict";

const http = require("http");
const net = require("net");

const HEAD = "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";

async function main() {
  const bodies = JSON.parse(require("fs").readFileSync(0, "utf8"));
  const verdicts = new Array(bodies.length);
  const settled = new Array(bodies.length);
  const server = http.createServer({ insecureHTTPParser: false }, (req, res) => {
    const id = Number(req.headers["x-id"]);
    req.socket.verdictId = id;
    const parts = [];
    req.on("data", (d) => parts.push(d));
    req.on("end", () => {
      verdicts[id] = { verdict: "accept", body: Buffer.concat(parts).toString("base64") };
      res.end();
    });
  });
  server.on("clientError", (err, socket) => {
    const id = socket.verdictId;
    // What follows an accepted body is another request's: not this body's verdict.
    if (id !== undefined && verdicts[id] === undefined) {
      verdicts[id] = err.code === "HPE_INVALID_EOF_STATE"
        ? { verdict: "incomplete" } : { verdict: "refuse", code: err.code };
    }
    socket.destroy();
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = server.address().port;

  const one = (id) => new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1", () => {
      socket.write(Buffer.concat([
        Buffer.from(HEAD.replace("\r\n\r\n", `\r\nX-Id: ${id}\r\n\r\n`), "latin1"),
        Buffer.from(bodies[id], "base64"),
      ]));
      socket.end();
    });
    socket.on("data", () => {});
    socket.on("error", () => {});
    socket.on("close", resolve);
  });
  const batch = 32;
  for (let start = 0; start < bodies.length; start += batch) {
    const ids = [];
    for (let id = start; id < Math.min(bodies.length, start + batch); id++) ids.push(id);
    await Promise.all(ids.map(one));
  }
  // The server may see the end of a connection after its client did.
  for (let wait = 0; wait < 200 && verdicts.includes(undefined); wait++) {
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  server.close();
  server.closeAllConnections();
  for (let id = 0; id < bodies.length; id++) settled[id] = verdicts[id] || { verdict: "none" };
  // Exit once the answer is written (to a pipe, writes are asynchronous), whatever is open.
  process.stdout.write(JSON.stringify({
    node: process.version, llhttp: process.versions.llhttp, verdicts: settled,
  }), () => process.exit(0));
}

main().catch((err) => { console.error(err); process.exit(1); });
