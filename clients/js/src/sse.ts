// The event-stream parsing of the HTML standard, incremental: LF, CRLF or CR line ends, fields
// gathered line by line, a frame complete only at the blank line that ends it (comments skipped).
// A frame cut off by a dropped connection is never handed out, so the stream resumes after the
// last event it *dispatched* (docs/design/streaming.md#frames). Written here rather than taken
// from a package: the client then has no runtime dependency, and it is the Python client's decoder.

export interface Frame {
  id: string | null;
  event: string;
  data: string;
}

export class SSEDecoder {
  /** The last `retry:` the stream sent (ms), if any. */
  retry: number | null = null;
  readonly #text = new TextDecoder("utf-8");
  #buffer = "";
  #afterCR = false;
  #id: string | null = null;
  #event = "";
  #data: string[] = [];

  /** The frames `chunk` completes. */
  feed(chunk: Uint8Array): Frame[] {
    let text = this.#text.decode(chunk, { stream: true });
    if (text === "") return []; // part of a character
    if (this.#afterCR && text.startsWith("\n")) text = text.slice(1); // a CRLF split between two chunks
    this.#afterCR = text.endsWith("\r");
    const lines = (this.#buffer + text).replace(/\r\n?/g, "\n").split("\n");
    this.#buffer = lines.pop() ?? "";
    const frames: Frame[] = [];
    for (const line of lines) {
      if (line === "") {
        if (this.#data.length > 0) frames.push({ id: this.#id, event: this.#event || "message", data: this.#data.join("\n") });
        this.#id = null;
        this.#event = "";
        this.#data = [];
        continue;
      }
      const colon = line.indexOf(":");
      if (colon === 0) continue; // a comment (`: keep-alive`)
      const name = colon === -1 ? line : line.slice(0, colon);
      let value = colon === -1 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (name === "data") this.#data.push(value);
      else if (name === "id" && !value.includes("\0")) this.#id = value;
      else if (name === "event") this.#event = value;
      else if (name === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
    }
    return frames;
  }
}
