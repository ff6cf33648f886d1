// A small Markdown subset rendered as DOM nodes: fenced code blocks, headings, lists, block
// quotes, rules, paragraphs; inline code, strong and emphasis, and links with a safe scheme.
// Text reaches the page only as text nodes: nothing the model writes is parsed as HTML, so
// markup in a reply shows as the characters it is made of.

const SAFE_SCHEMES = new Set(["http:", "https:", "mailto:"]);

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const ITEM = /^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/;

// Earliest inline construct first: a code span, strong, emphasis or a link.
const INLINE = new RegExp(
  [
    /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/.source,
    /\*\*(?=\S)([\s\S]*?\S)\*\*/.source,
    /__(?=\S)([\s\S]*?\S)__/.source,
    /\*(?=[^\s*])([\s\S]*?[^\s*])\*/.source,
    /(?<![\w])_(?=[^\s_])([\s\S]*?[^\s_])_(?![\w])/.source,
    /\[([^\]\n]+)\]\(\s*([^)\s]+)\s*\)/.source,
  ].join("|"),
  "g",
);

/** Renders `text` as a fragment of safe DOM nodes. */
export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  for (const block of parseBlocks(text.replace(/\r\n?/g, "\n").split("\n"))) {
    fragment.append(renderBlock(block));
  }
  return fragment;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
    ITEM.test(line);
}

function parseBlocks(lines) {
  const blocks = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let match;
    if (!line.trim()) {
      i += 1;
    } else if ((match = FENCE.exec(line))) {
      const marker = match[1];
      const closes = (text) =>
        text.length >= marker.length && text === marker[0].repeat(text.length);
      const body = [];
      i += 1;
      // An unclosed fence (a reply still streaming) runs to the end.
      while (i < lines.length && !closes(lines[i].trim())) body.push(lines[i++]);
      i += 1;
      blocks.push({ type: "code", language: match[2], text: body.join("\n") });
    } else if ((match = HEADING.exec(line))) {
      blocks.push({ type: "heading", level: match[1].length, text: match[2] });
      i += 1;
    } else if (RULE.test(line)) {
      blocks.push({ type: "rule" });
      i += 1;
    } else if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && (match = QUOTE.exec(lines[i]))) {
        body.push(match[1]);
        i += 1;
      }
      blocks.push({ type: "quote", blocks: parseBlocks(body) });
    } else if ((match = ITEM.exec(line))) {
      const ordered = /\d/.test(match[1]);
      const items = [];
      while (i < lines.length) {
        const item = ITEM.exec(lines[i]);
        if (item && /\d/.test(item[1]) === ordered) {
          items.push(item[2]);
        } else if (item || !lines[i].trim() || !/^\s/.test(lines[i])) {
          break;
        } else {
          items[items.length - 1] += "\n" + lines[i].trim();
        }
        i += 1;
      }
      blocks.push({ type: "list", ordered, start: ordered ? parseInt(match[1], 10) : 1, items });
    } else {
      const body = [line];
      i += 1;
      while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) body.push(lines[i++]);
      blocks.push({ type: "paragraph", text: body.join("\n") });
    }
  }
  return blocks;
}

function renderBlock(block) {
  switch (block.type) {
    case "code": {
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      if (/^[\w+#.-]+$/.test(block.language)) code.className = `language-${block.language}`;
      code.textContent = block.text;
      pre.append(code);
      return pre;
    }
    case "heading":
      return withInline(document.createElement(`h${block.level}`), block.text);
    case "rule":
      return document.createElement("hr");
    case "quote": {
      const quote = document.createElement("blockquote");
      for (const inner of block.blocks) quote.append(renderBlock(inner));
      return quote;
    }
    case "list": {
      const list = document.createElement(block.ordered ? "ol" : "ul");
      if (block.ordered && block.start !== 1) list.start = block.start;
      for (const item of block.items) list.append(withInline(document.createElement("li"), item));
      return list;
    }
    default:
      return withInline(document.createElement("p"), block.text);
  }
}

function withInline(element, text) {
  appendInline(element, text);
  return element;
}

function appendInline(parent, text) {
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    appendText(parent, text.slice(last, match.index));
    last = match.index + match[0].length;
    const [whole, , code, strong, strongUnderscore, em, emUnderscore, label, href] = match;
    if (code !== undefined) {
      const element = document.createElement("code");
      element.textContent = code.replace(/^ (.*) $/s, "$1");
      parent.append(element);
    } else if (strong !== undefined || strongUnderscore !== undefined) {
      parent.append(withInline(document.createElement("strong"), strong ?? strongUnderscore));
    } else if (em !== undefined || emUnderscore !== undefined) {
      parent.append(withInline(document.createElement("em"), em ?? emUnderscore));
    } else {
      const url = safeUrl(href);
      if (url === null) {
        appendText(parent, whole);
      } else {
        const link = withInline(document.createElement("a"), label);
        link.href = url;
        link.target = "_blank";
        link.rel = "noopener noreferrer";
        parent.append(link);
      }
    }
  }
  appendText(parent, text.slice(last));
}

function appendText(parent, text) {
  text.split("\n").forEach((line, index) => {
    if (index > 0) parent.append(document.createElement("br"));
    if (line) parent.append(document.createTextNode(line));
  });
}

/** The link's absolute URL when its scheme is http, https or mailto; else null. */
export function safeUrl(href) {
  try {
    const url = new URL(href, document.baseURI);
    return SAFE_SCHEMES.has(url.protocol) ? url.href : null;
  } catch {
    return null;
  }
}
