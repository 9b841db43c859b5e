/*
 * Agent console helpers: DOM building (text only ever through textContent), the JSON API client
 * (cookie session + X-CSRF-Token on every POST but login), and formatting.
 */
import { locale, t } from "./agent_i18n.js";

/** h("li", {class: "x", text: "hi", onclick: fn}, [children]) -> element; `text` is textContent. */
export function h(tag, attrs, children) {
  const el = document.createElement(tag);
  Object.keys(attrs || {}).forEach((k) => {
    const v = attrs[k];
    if (v == null || v === false) return;
    if (k === "text") el.textContent = v;
    else if (k.slice(0, 2) === "on") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  });
  (children || []).forEach((c) => {
    if (c != null) el.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  });
  return el;
}

export const $ = (id) => document.getElementById(id);

/* Inline SVG icons: emoji render as empty boxes where no emoji font is installed (Chromium's
 * default on a server). Paths are constants of this file, drawn on a 24-unit grid. */
export const ICONS = {
  thumbUp: "M2 10h4v11H2zM8 21V10l4.6-7.2c.8-1.2 2.7-.6 2.6.9L14.8 9H20a2 2 0 0 1 2 2.3l-1.3 8A2 2 0 0 1 18.7 21z",
  globe: "M12 2a10 10 0 1 0 0 20 10 10 0 0 0 0-20zm6.9 9h-3a15 15 0 0 0-1.4-6.3A8 8 0 0 1 18.9 11zM12 4.1c.9 1.3 " +
    "1.8 3.7 1.9 6.9h-3.8c.1-3.2 1-5.6 1.9-6.9zM9.5 4.7A15 15 0 0 0 8.1 11h-3a8 8 0 0 1 4.4-6.3zM5.1 13h3a15 15 0 0 0 " +
    "1.4 6.3A8 8 0 0 1 5.1 13zm6.9 6.9c-.9-1.3-1.8-3.7-1.9-6.9h3.8c-.1 3.2-1 5.6-1.9 6.9zm2.5-.6a15 15 0 0 0 " +
    "1.4-6.3h3a8 8 0 0 1-4.4 6.3z",
};

/** An icon as an <svg>: decorative (aria-hidden) unless `label` names it (role img). `flip`
 * turns it upside down (a thumb down from the thumb up). */
export function icon(name, label, flip) {
  const ns = "http://www.w3.org/2000/svg", svg = document.createElementNS(ns, "svg");
  const path = svg.appendChild(document.createElementNS(ns, "path"));
  path.setAttribute("d", ICONS[name]);
  path.setAttribute("fill", "currentColor");
  if (flip) path.setAttribute("transform", "rotate(180 12 12)");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("class", "icon");
  svg.setAttribute("focusable", "false");
  if (label) { svg.setAttribute("role", "img"); svg.setAttribute("aria-label", label); }
  else svg.setAttribute("aria-hidden", "true");
  return svg;
}

/** A link target that cannot run script: absolute http(s), a same-origin path, or a KB article. */
export function safeHref(raw) {
  const s = String(raw || "").trim();
  if (!s) return null;
  try {
    if (/^[a-z][a-z0-9+.-]*:/i.test(s) || /^\/\//.test(s)) {
      const u = new URL(s, location.href);
      return u.protocol === "http:" || u.protocol === "https:" ? u.href : null;
    }
    const path = s[0] === "/" ? s : "/kb/" + s.replace(/^\.?\/+/, "").replace(/^kb\//, "");
    return new URL(path, location.origin).href;
  } catch (e) { return null; }
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message || "HTTP " + status);
    this.status = status;
  }
}

/** The message of an error body: {"error": "..."} or {"error": {"message": "..."}}. */
export function errorText(data, status) {
  const e = data && data.error;
  if (typeof e === "string" && e) return e;
  if (e && typeof e.message === "string" && e.message) return e.message;
  return status ? "HTTP " + status : "";
}

const auth = { csrf: "", onUnauthorized: null };

export function setCsrf(token) { auth.csrf = token || ""; }
/** Called on a 401 from any call but the session check and login: the session has ended. */
export function onUnauthorized(fn) { auth.onUnauthorized = fn; }

/** JSON request to the agent API; non-2xx throws ApiError with the server's message. */
export async function api(method, path, body, opts) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && auth.csrf) headers["X-CSRF-Token"] = auth.csrf;
  let res;
  try {
    res = await fetch(path, {
      method: method, headers: headers, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new ApiError(0, t("network"));
  }
  const data = await res.json().catch(() => ({}));
  if (!res.ok) {
    if (res.status === 401 && !(opts && opts.quiet401) && auth.onUnauthorized) auth.onUnauthorized();
    throw new ApiError(res.status, errorText(data, res.status));
  }
  return data || {};
}

/** The user-facing text for a failed call. */
export function describe(err) {
  if (err && err.status === 0) return t("network");
  return t("error", { message: (err && err.message) || "?" });
}

export function parseTime(iso) {
  const d = new Date(iso);
  return isNaN(d.getTime()) ? null : d;
}

/** "14:05" today, "3 Dec, 14:05" otherwise. */
export function shortTime(iso) {
  const d = parseTime(iso);
  if (!d) return "";
  const today = new Date().toDateString() === d.toDateString();
  const opts = today ? { hour: "2-digit", minute: "2-digit" }
    : { day: "numeric", month: "short", hour: "2-digit", minute: "2-digit" };
  return d.toLocaleString(locale(), opts);
}

export function fullTime(iso) {
  const d = parseTime(iso);
  return d ? d.toLocaleString(locale()) : "";
}

/** Seconds -> "42 s" / "3 min 5 s" / "1 h 20 min". */
export function duration(seconds) {
  const s = Math.round(Number(seconds));
  if (!isFinite(s)) return t("r_none");
  if (s < 60) return t("seconds", { n: s });
  if (s < 3600) return t("minutes", { m: Math.floor(s / 60), s: s % 60 });
  return t("hours", { h: Math.floor(s / 3600), m: Math.floor((s % 3600) / 60) });
}

export function percent(x) {
  const n = Number(x);
  return isFinite(n) ? new Intl.NumberFormat(locale(), { style: "percent", maximumFractionDigits: 1 }).format(n) : t("r_none");
}

export function number(x, digits) {
  const n = Number(x);
  return x != null && isFinite(n)
    ? new Intl.NumberFormat(locale(), { maximumFractionDigits: digits == null ? 0 : digits }).format(n) : t("r_none");
}

/** A local calendar date as YYYY-MM-DD. */
export function isoDate(d) {
  const pad = (n) => (n < 10 ? "0" : "") + n;
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate());
}

/** True while the keyboard focus is somewhere the agent types (shortcuts stay off there). */
export function isTypingTarget(el) {
  if (!el || el === document.body) return false;
  const tag = el.tagName;
  if (tag === "TEXTAREA" || tag === "SELECT" || el.isContentEditable) return true;
  if (tag !== "INPUT") return false;
  return ["button", "checkbox", "radio", "submit", "reset"].indexOf((el.type || "").toLowerCase()) < 0;
}
