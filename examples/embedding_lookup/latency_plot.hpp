// A latency plot as a standalone SVG: for each panel (e.g. cold and warm page cache), the
// latency distribution of every size class under each queue, drawn as percentile curves
// (x: percentile on a "nines" scale from p50 to p99.9, y: latency in ms on a log scale).
#pragma once

#include "workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace embedding {

struct PlotSeries {
  std::string label;
  std::vector<double> sorted_ms;
  std::string color;
  bool dashed = false;
};

struct PlotPanel {
  std::string title;
  std::vector<PlotSeries> series;
};

inline std::string xml_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '&':
      out += "&amp;";
      break;
    case '\'':
      out += "&apos;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

inline void write_latency_svg(const std::string& path, const std::string& title, const std::vector<PlotPanel>& panels) {
  const double panel_w = 520, panel_h = 360, left = 70, top = 60, gap = 90;
  const double width = left + static_cast<double>(panels.size()) * (panel_w + gap) + 20;
  const double height = top + panel_h + 150;
  double lo = 1e9, hi = 0;
  for (const auto& p : panels) {
    for (const auto& s : p.series) {
      if (!s.sorted_ms.empty()) {
        lo = std::min(lo, std::max(1e-3, s.sorted_ms.front()));
        hi = std::max(hi, s.sorted_ms.back());
      }
    }
  }
  if (hi <= 0) {
    return;
  }
  const double ylo = std::pow(10.0, std::floor(std::log10(lo)));
  const double yhi = std::pow(10.0, std::ceil(std::log10(hi)));
  // x: -log10(1 - q), so p50 -> 0.3, p90 -> 1, p99 -> 2, p99.9 -> 3.
  const auto nines = [](double q) { return -std::log10(1.0 - q); };
  const double xlo = nines(0.5), xhi = nines(0.999);

  std::string svg;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' font-family='sans-serif' "
                "font-size='12'>\n<rect width='100%%' height='100%%' fill='white'/>\n"
                "<text x='%.0f' y='24' font-size='16' font-weight='bold'>%s</text>\n",
                width, height, left, xml_escape(title).c_str());
  svg += buf;
  for (std::size_t pi = 0; pi < panels.size(); ++pi) {
    const double x0 = left + static_cast<double>(pi) * (panel_w + gap);
    const auto px = [&](double q) { return x0 + (nines(q) - xlo) / (xhi - xlo) * panel_w; };
    const auto py = [&](double ms) {
      const double v = std::clamp(ms, ylo, yhi);
      return top + panel_h - (std::log10(v) - std::log10(ylo)) / (std::log10(yhi) - std::log10(ylo)) * panel_h;
    };
    std::snprintf(buf, sizeof buf,
                  "<text x='%.0f' y='%.0f' font-size='14'>%s</text>\n<rect x='%.0f' y='%.0f' width='%.0f' "
                  "height='%.0f' fill='none' stroke='#444'/>\n",
                  x0, top - 10, xml_escape(panels[pi].title).c_str(), x0, top, panel_w, panel_h);
    svg += buf;
    for (double d = ylo; d <= yhi * 1.0001; d *= 10) {
      std::snprintf(buf, sizeof buf,
                    "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' stroke='#ddd'/>\n<text x='%.1f' y='%.1f' "
                    "text-anchor='end'>%g ms</text>\n",
                    x0, x0 + panel_w, py(d), py(d), x0 - 4, py(d) + 4, d);
      svg += buf;
    }
    for (const double q : {0.5, 0.9, 0.99, 0.999}) {
      std::snprintf(buf, sizeof buf,
                    "<line x1='%.1f' x2='%.1f' y1='%.0f' y2='%.0f' stroke='#ddd'/>\n<text x='%.1f' y='%.0f' "
                    "text-anchor='middle'>p%g</text>\n",
                    px(q), px(q), top, top + panel_h, px(q), top + panel_h + 16, q * 100);
      svg += buf;
    }
    double legend_y = top + panel_h + 36;
    for (const auto& s : panels[pi].series) {
      if (s.sorted_ms.size() < 2) {
        continue;
      }
      std::string points;
      for (int k = 0; k <= 200; ++k) {
        const double x = xlo + (xhi - xlo) * k / 200.0;
        const double q = 1.0 - std::pow(10.0, -x);
        const auto i =
            std::min(s.sorted_ms.size() - 1, static_cast<std::size_t>(q * static_cast<double>(s.sorted_ms.size())));
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(q), py(s.sorted_ms[i]));
        points += buf;
      }
      const char* dash = s.dashed ? " stroke-dasharray='6,4'" : "";
      svg += "<polyline fill='none' stroke='" + s.color + "' stroke-width='2'" + dash + " points='" + points + "'/>\n";
      std::snprintf(buf, sizeof buf,
                    "<line x1='%.0f' x2='%.0f' y1='%.0f' y2='%.0f' stroke='%s' stroke-width='2'%s/>\n"
                    "<text x='%.0f' y='%.0f'>%s</text>\n",
                    x0, x0 + 30, legend_y - 4, legend_y - 4, s.color.c_str(), dash, x0 + 36, legend_y,
                    xml_escape(s.label).c_str());
      svg += buf;
      legend_y += 16;
    }
  }
  svg += "</svg>\n";
  std::ofstream(path) << svg;
}

} // namespace embedding
