"""A supervisor and two workers written with LangGraph (`langgraph`, `langchain-openai`), as a program
you already have would be: a solver with a calculator tool answers first; a supervisor then routes the
work to a checker, back to the solver, or ends it. Every model is a `ChatOpenAI` on one
OpenAI-compatible base URL, its model name its role (supervisor, solver, checker). Nothing here knows
about tracerl.

A function `await agent(task, base_url, api_key)` (task.prompt is the question), and
`agent_checked`, the same team where every answer of the solver goes to the checker before the
supervisor decides (re-solve or done): the checker's answer is the final one. Trained with tracerl
(harnesses/programs/openai_agent.py, docs/frameworks.md):

    python scripts/train.py experiment=smollm2_langgraph   # conf/harness/langgraph.yaml
    python scripts/train.py experiment=smollm2_langgraph \
        harness.options.agent=examples.langgraph_supervisor.agent_checked
"""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from examples.calculator_agent import calculator as evaluate  # the hardened evaluator: model text never raises

MAX_CALLS = 6  # model calls per question, all roles together
WORKERS = ("solver", "checker")

SOLVER = "Solve the problem. Use the calculator for arithmetic. Give the final answer in <answer></answer> tags."
CHECKER = "Check the solver's answer and give the final one in <answer></answer> tags."
SUPERVISOR = (
    "You supervise a solver and a checker. Reply with one word: checker to have the answer checked, "
    "solver to have it solved again, or done when the answer is final."
)


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses."""
    return evaluate(expression)


class State(MessagesState):
    calls: int  # model calls so far, all roles together
    next: str  # the supervisor's choice: a worker, or done


def build_graph(base_url: str, api_key: str, check_every_answer: bool = False):
    """The compiled graph. The solver's answer goes to the supervisor, which routes; with
    `check_every_answer` it goes to the checker first (a fixed edge), and the supervisor routes
    after the checker."""

    def chat(role: str) -> ChatOpenAI:
        return ChatOpenAI(model=role, base_url=base_url, api_key=api_key, max_retries=0)

    solver_llm = chat("solver").bind_tools([calculator])
    checker_llm, supervisor_llm = chat("checker"), chat("supervisor")

    async def solver(state: State) -> dict:
        reply = await solver_llm.ainvoke([SystemMessage(SOLVER), *state["messages"]])
        return {"messages": [reply], "calls": state["calls"] + 1}

    async def checker(state: State) -> dict:
        reply = await checker_llm.ainvoke([SystemMessage(CHECKER), *state["messages"]])
        return {"messages": [reply], "calls": state["calls"] + 1}

    async def supervisor(state: State) -> dict:
        if state["calls"] >= MAX_CALLS:
            return {"next": "done"}
        reply = await supervisor_llm.ainvoke([SystemMessage(SUPERVISOR), *state["messages"]])
        words = str(reply.content).lower().split()
        choice = next((w.strip(".,:!") for w in words if w.strip(".,:!") in WORKERS), "done")
        return {"next": choice, "calls": state["calls"] + 1}

    def after_solver(state: State) -> str:
        last = state["messages"][-1]
        if state["calls"] >= MAX_CALLS:
            return "supervisor"  # which ends the run
        if isinstance(last, AIMessage) and last.tool_calls:
            return "tools"
        return "checker" if check_every_answer else "supervisor"

    graph = StateGraph(State)
    graph.add_node("solver", solver)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_node("checker", checker)
    graph.add_node("supervisor", supervisor)
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", after_solver, ["tools", "checker", "supervisor"])
    graph.add_edge("tools", "solver")
    graph.add_edge("checker", "supervisor")
    graph.add_conditional_edges(
        "supervisor", lambda state: state["next"], {"solver": "solver", "checker": "checker", "done": END}
    )
    return graph.compile()


async def run(question: str, base_url: str, api_key: str, check_every_answer: bool = False) -> str:
    """The graph on one question: the last model answer (the supervisor's replies are not messages)."""
    graph = build_graph(base_url, api_key, check_every_answer)
    final = await graph.ainvoke({"messages": [HumanMessage(question)], "calls": 0})
    answers = [m for m in final["messages"] if isinstance(m, AIMessage)]
    return str(answers[-1].content) if answers else ""


async def agent(task, base_url: str, api_key: str) -> str:
    return await run(task.prompt, base_url, api_key)


async def agent_checked(task, base_url: str, api_key: str) -> str:
    """Every answer checked (harness.options.agent=examples.langgraph_supervisor.agent_checked): an
    untrained small supervisor (SmolLM2-135M) never routes to the checker, so a team trained from it
    never trains the checker; this graph always reaches it."""
    return await run(task.prompt, base_url, api_key, check_every_answer=True)
